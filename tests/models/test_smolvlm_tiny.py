"""``smolvlm-tiny``: built once and cached, byte-identical across builds, its processor's
image expansion, a transformers forward with pixels, and ``is_vision``. One build into a
temporary LOOMRL_HOME is shared by the module (a build takes ~8 s)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from loomrl import models
from loomrl.engines.vllm import _config_max_len
from loomrl.models import DEFAULT_MODEL, check_spec, is_prepared, is_vision, resolve
from loomrl.models.smolvlm_tiny import IMAGE_SEQ_LEN, build
from loomrl.models.store import MARKER

FAKE, IMAGE, GLOBAL = 49152, 49153, 49155  # <fake_token_around_image>, <image>, <global-img>
BLOCK = [FAKE, GLOBAL] + [IMAGE] * 16 + [FAKE]  # what one <image> becomes


@pytest.fixture(scope="module")
def build_calls() -> list[Path]:
    """The text directories the module's builds through ``resolve`` were given."""
    return []


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_calls) -> Path:
    """``resolve("smolvlm-tiny")`` in a fresh home that sees the prepared default model,
    its builds recorded in ``build_calls``."""
    default = resolve(DEFAULT_MODEL)  # prepared by the session fixture
    home = tmp_path_factory.mktemp("vlm-home")
    (home / "models").mkdir()
    (home / "models" / DEFAULT_MODEL).symlink_to(default)

    def counted(out: Path, text_dir: Path, seed: int = 0) -> None:
        build_calls.append(text_dir)
        build(out, text_dir, seed)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOOMRL_HOME", str(home))
        patch.setattr(models.smolvlm_tiny, "build", counted)
        yield resolve("smolvlm-tiny")


def sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def image(width: int = 100, height: int = 80, seed: int = 0):
    import numpy as np
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_resolve_builds_once_then_reuses_the_cache(built, build_calls):
    assert built.name == "smolvlm-tiny" and built.parent.name == "models"
    assert is_prepared("smolvlm-tiny")
    assert json.loads((built / MARKER).read_text())["seed"] == 0
    assert not models.missing_parts(built)
    assert build_calls == [built.parent / DEFAULT_MODEL]  # from the default model's directory
    assert resolve("smolvlm-tiny") == built
    check_spec("smolvlm-tiny")
    assert len(build_calls) == 1
    assert "smolvlm-tiny" in models.NAMED


def test_two_builds_write_identical_files(built, tmp_path):
    import torch

    rng = torch.random.get_rng_state()
    build(tmp_path / "b", resolve(DEFAULT_MODEL))
    assert torch.equal(torch.random.get_rng_state(), rng)  # the seed stays in the build
    assert sha256(tmp_path / "b" / "model.safetensors") == sha256(built / "model.safetensors")
    names = sorted(p.name for p in built.iterdir() if p.name != MARKER)
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "b" / name).read_bytes() == (built / name).read_bytes(), name


def test_config_is_idefics3_with_the_default_text_model(built):
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert config["image_token_id"] == IMAGE and config["scale_factor"] == 2
    assert config["text_config"]["vocab_size"] == 49156
    vision = config["vision_config"]
    assert vision["image_size"] == 64 and vision["patch_size"] == 8 and vision["hidden_size"] == 128
    assert IMAGE_SEQ_LEN == 16
    # vLLM's context length comes from text_config (the top level has none here).
    assert "max_position_embeddings" not in config
    assert _config_max_len(built) == 8192 == _config_max_len(resolve(DEFAULT_MODEL))


def test_processor_expands_one_image_placeholder_to_19_tokens(built):
    from transformers import AutoProcessor, AutoTokenizer

    processor = AutoProcessor.from_pretrained(built)
    content = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    text = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    assert text.count("<image>") == 1 and text.endswith("<|im_start|>assistant\n")
    plain = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert plain.count(IMAGE) == 1
    at = plain.index(IMAGE)
    out = processor(text=text, images=[image()], add_special_tokens=False, return_tensors="pt")
    assert out["input_ids"][0].tolist() == plain[:at] + BLOCK + plain[at + 1 :]
    assert tuple(out["pixel_values"].shape) == (1, 1, 3, 64, 64)  # 80x100 squashed, no tiles

    # String content renders exactly as the default model's own chat template does.
    messages = [{"role": "user", "content": "Hi there"}]
    default = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    assert processor.apply_chat_template(messages, tokenize=False) == (
        default.apply_chat_template(messages, tokenize=False)
    )


def test_transformers_forward_with_pixels(built):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(built)
    model = AutoModelForImageTextToText.from_pretrained(built, dtype=torch.float32).eval()
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    text = "<|im_start|>user\n<image>Describe it.<|im_end|>\n<|im_start|>assistant\n"
    last = []
    for seed in (0, 1):
        inputs = processor(text=text, images=[image(seed=seed)], return_tensors="pt")
        with torch.no_grad():
            logits = model(**inputs).logits
        assert logits.shape == (1, inputs["input_ids"].shape[1], 49156)
        assert torch.isfinite(logits).all()
        last.append(logits[0, -1])
    assert not torch.equal(last[0], last[1])  # the image reaches the text model


def test_is_vision(built, tmp_path):
    assert is_vision(built)
    assert not is_vision(resolve(DEFAULT_MODEL))
    for model_type, expected in (("fuyu", True), ("qwen2_vl", True), ("llama", False)):
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
        assert is_vision(tmp_path) is expected, model_type
