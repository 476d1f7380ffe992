"""Loading a model directory for training: the model class and what a checkpoint saves
beside its weights, chosen by whether the model sees images; or only the model's shapes,
on the meta device, for the ranks of a sharded run that receive the weights instead of
reading them (``loomrl.train.sharding.shard_from_rank0``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_lm(path: str | Path, dtype: Any = None) -> Any:
    """The language model in ``path`` with its LM head (``load_lm_class``)."""
    kwargs = {} if dtype is None else {"dtype": dtype}
    return load_lm_class(path).from_pretrained(path, **kwargs)


def empty_lm(path: str | Path, dtype: Any = None) -> Any:
    """``load_lm``'s model without its weights: on the meta device (see ``on_meta``)."""
    return on_meta(load_lm_class(path), path, dtype)


def on_meta(auto_class: Any, path: str | Path, dtype: Any = None) -> Any:
    """The model ``auto_class.from_pretrained(path, dtype=dtype)`` would load, built from
    its config on the meta device: the same modules, parameter names, dtypes, tied weights
    and generation config, no memory and nothing read but the JSON files. In eval mode, as
    ``from_pretrained`` returns a model. Its buffers are meta too, non-persistent ones
    (rotary ``inv_freq``) included: whoever fills the weights must fill those as well."""
    import torch
    from transformers import AutoConfig, GenerationConfig

    kwargs = {} if dtype is None else {"dtype": dtype}
    with torch.device("meta"):
        model = auto_class.from_config(AutoConfig.from_pretrained(path), **kwargs)
    if (Path(path) / "generation_config.json").is_file() and hasattr(model, "generation_config"):
        model.generation_config = GenerationConfig.from_pretrained(path)  # a checkpoint saves it
    return model.eval()


def load_lm_class(path: str | Path) -> Any:
    """The auto class of the model in ``path``: ``AutoModelForImageTextToText`` for a
    vision-language model (its forward takes ``pixel_values``), else
    ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from loomrl.models import is_vision

    return AutoModelForImageTextToText if is_vision(path) else AutoModelForCausalLM


def load_preprocessor(path: str | Path) -> Any:
    """What turns text (and images) into the model's inputs, to save with its weights: the
    processor of a vision-language model (tokenizer, image processor and chat template,
    all of which vLLM needs to serve a checkpoint), else the tokenizer. Both have
    ``save_pretrained``; the tokenizer is ``.tokenizer`` of a processor."""
    from transformers import AutoProcessor, AutoTokenizer

    from loomrl.models import is_vision

    kind = AutoProcessor if is_vision(path) else AutoTokenizer
    return kind.from_pretrained(path)


def tokenizer_of(preprocessor: Any) -> Any:
    """The tokenizer of a processor, or the tokenizer itself."""
    return getattr(preprocessor, "tokenizer", preprocessor)
