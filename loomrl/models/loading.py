"""Loading a model directory for training: the model class and what a checkpoint saves
beside its weights, chosen by whether the model sees images."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_lm(path: str | Path, dtype: Any = None) -> Any:
    """The language model in ``path`` with its LM head (``load_lm_class``)."""
    kwargs = {} if dtype is None else {"dtype": dtype}
    return load_lm_class(path).from_pretrained(path, **kwargs)


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
