"""``RewardModel``: a local Hugging Face sequence-classification model as a reward source.

The model is read from a local directory (``local_files_only``: nothing is downloaded)
with ``AutoModelForSequenceClassification``; its score is the logit ``label_index``
(``num_labels == 1`` models need none). Input is the chat-templated conversation ending
in the completion (``input="chat"``), the completion alone (``"completion"``), or any
``fn(sample) -> str``.

Batching: texts are sorted by token length, cut into batches of ``batch_size``, padded
on the *right* with the model's ``pad_token_id`` whatever the tokenizer's own
``padding_side`` (real tokens keep positions ``0..n-1``, exactly as unbatched), scored
under ``torch.inference_mode`` and put back in order, so batched and one-by-one scores
agree to float tolerance. Decoder classifiers pool the last token that is not
``pad_token_id``: a text whose last token *is* the pad token would be pooled at an
earlier position, so it is refused with an error. With ``max_length`` set, longer inputs
are cut from the left (the completion's end is kept); without it, an input longer than
the model's positions is an error.

Images: when the directory also holds a processor with an image processor (Gemma3's,
say: ``AutoModelForSequenceClassification`` maps ``gemma3`` to a classifier that takes
``pixel_values``), ``input="chat"`` renders with the processor's chat template, one
placeholder per image part, loads the sample's images in order and lets the processor
expand the placeholders and build each batch (``loomrl.rewards.vision_inputs``). Batching,
right padding, pooling checks and order are as above; samples without images work too.
An image that does not load is an ``ImageError`` naming the sample, message and part;
an input with images longer than ``max_length`` is refused, never cut. A text-only
model given a sample with images in ``"chat"`` mode raises instead of dropping them;
``"completion"`` and callable inputs are text by choice and never carry images.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from loomrl.rewards import vision_inputs as vision
from loomrl.rewards.base import RewardSample
from loomrl.rewards.vision_inputs import VisionInput

InputMode = Literal["chat", "completion"] | Callable[[RewardSample], str]


class RewardModel:
    """Batched, device-aware, no-grad scores from a local sequence classifier."""

    def __init__(
        self,
        path: str | Path,
        *,
        input: InputMode = "chat",
        batch_size: int = 8,
        device: str | None = None,
        dtype: Any = None,
        max_length: int | None = None,
        label_index: int | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(path).expanduser()
        if not path.is_dir():
            raise ValueError(
                f"reward model {str(path)!r} is not a local directory (models are never "
                "downloaded; save one with save_pretrained and pass its directory)"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
        if input not in ("chat", "completion") and not callable(input):
            raise ValueError(f"input must be 'chat', 'completion' or a callable, got {input!r}")
        self.path, self.input = path, input
        self.batch_size, self.max_length = batch_size, max_length
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        kwargs = {"dtype": dtype} if dtype is not None else {}
        model = AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True, **kwargs
        )
        self.label_index = _label_index(path, model.config.num_labels, label_index)
        config = model.config.get_text_config()  # what the classifier reads its pad id from
        self.processor = vision.load_processor(path)  # None for a text-only model
        if self.processor is not None:
            tokenizer = self.processor.tokenizer
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        tokenizer.truncation_side = "left"  # keep the end of over-long inputs
        template = (self.processor if self.processor is not None else tokenizer).chat_template
        if input == "chat" and not template:
            raise ValueError(
                f"reward model {str(path)!r} has no chat template; pass input='completion' "
                "or a function of the sample"
            )
        if config.pad_token_id is None:
            config.pad_token_id = tokenizer.pad_token_id
        if config.pad_token_id is None and batch_size > 1:
            raise ValueError(
                f"reward model {str(path)!r} defines no pad token (neither its config nor its "
                "tokenizer), so it cannot score padded batches: set pad_token_id in its "
                "config or pass batch_size=1"
            )
        self.tokenizer, self.model = tokenizer, model.to(self.device).eval()
        self._pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.max_positions: int | None = getattr(config, "max_position_embeddings", None)
        self._lock = threading.Lock()  # one forward pass at a time per model

    @property
    def sees_images(self) -> bool:
        """Whether samples' images reach the model (a processor and ``input="chat"``)."""
        return self.processor is not None and self.input == "chat"

    async def __call__(self, samples: Sequence[RewardSample]) -> list[float]:
        if self.sees_images:  # image decoding blocks too: all of it off the loop
            return await asyncio.to_thread(
                lambda: self.score_inputs([self.render_input(s, i) for i, s in enumerate(samples)])
            )
        texts = [self.render(s, i) for i, s in enumerate(samples)]
        special = self.input != "chat"  # a chat template writes its own special tokens
        return await asyncio.to_thread(self.score_texts, texts, add_special_tokens=special)

    def render(self, sample: RewardSample, index: int = 0) -> str:
        """The text the classifier reads for ``sample`` (``index`` names it in errors);
        a vision model's text holds one placeholder per image."""
        if self.sees_images:
            return self.render_input(sample, index).text
        if self.input == "chat":
            vision.refuse_images(self.path, sample, index)
            return self.tokenizer.apply_chat_template(sample.conversation(), tokenize=False)
        if self.input == "completion":
            return sample.completion
        return str(self.input(sample))

    def score_texts(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[float]:
        """Scores of ``texts`` in order (blocking; ``__call__`` runs it in a thread)."""
        import torch

        encoded = [
            self.tokenizer(
                text,
                add_special_tokens=add_special_tokens,
                truncation=self.max_length is not None,
                max_length=self.max_length,
            )["input_ids"]
            for text in texts
        ]

        def batch(rows: list[int]) -> dict[str, Any]:
            width = max(len(encoded[i]) for i in rows)
            input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
            for row, i in enumerate(rows):  # right padding: see the module docstring
                input_ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
                attention_mask[row, : len(encoded[i])] = 1
            return {"input_ids": input_ids, "attention_mask": attention_mask}

        return self._score(encoded, batch)

    def render_input(self, sample: RewardSample, index: int = 0) -> VisionInput:
        """A vision model's input for ``sample``: placeholder text and loaded images."""
        if self.processor is None:
            raise ValueError(f"reward model {str(self.path)!r} has no image processor")
        return vision.render(self.processor, sample, index)

    def score_inputs(self, inputs: Sequence[VisionInput]) -> list[float]:
        """Scores of rendered vision inputs in order (blocking; see ``vision_inputs``)."""
        if self.processor is None:
            raise ValueError(f"reward model {str(self.path)!r} has no image processor")
        processor, max_length = self.processor, self.max_length
        encoded = vision.encode(processor, inputs, max_length)

        def batch(rows: list[int]) -> dict[str, Any]:
            chosen, expected = [inputs[i] for i in rows], [encoded[i] for i in rows]
            return vision.collate(processor, chosen, expected, self._pad_id, max_length)

        return self._score(encoded, batch)

    def _score(
        self, encoded: list[list[int]], batch: Callable[[list[int]], dict[str, Any]]
    ) -> list[float]:
        """Check ``encoded``, then score length-sorted batches (``batch(rows)`` gives the
        model's keyword arguments) and put the scores back in input order."""
        import torch

        if not encoded:
            return []
        self._check(encoded)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        scores: list[float] = [0.0] * len(encoded)
        dtype = self.model.dtype
        with self._lock, torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                kwargs = {
                    key: value.to(self.device, dtype if value.is_floating_point() else None)
                    for key, value in batch(rows).items()
                }
                logits = self.model(**kwargs).logits[:, self.label_index].float().cpu()
                for i, value in zip(rows, logits.tolist(), strict=True):
                    scores[i] = value
        return scores

    def _check(self, encoded: list[list[int]]) -> None:
        pad = self.model.config.get_text_config().pad_token_id
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"reward model input {i} is empty after tokenization")
            if pad is not None and ids[-1] == pad:
                token = self.tokenizer.convert_ids_to_tokens(pad)
                raise ValueError(
                    f"reward model input {i} ends with the pad token {token!r} (id {pad}); "
                    "the classifier pools the last non-pad token, so it would score an earlier "
                    "position: strip it from the input or use a model whose pad token differs"
                )
            if self.max_positions is not None and len(ids) > self.max_positions:
                raise ValueError(
                    f"reward model input {i} has {len(ids)} tokens, more than the model's "
                    f"{self.max_positions} positions: pass max_length= to cut inputs from the left"
                )

    def __repr__(self) -> str:
        return f"RewardModel({str(self.path)!r}, device={str(self.device)!r})"


def _label_index(path: Path, num_labels: int, label_index: int | None) -> int:
    if label_index is None:
        if num_labels != 1:
            raise ValueError(
                f"reward model {str(path)!r} has {num_labels} labels; pass label_index= to "
                "choose the logit that is the reward"
            )
        return 0
    if not 0 <= label_index < num_labels:
        raise ValueError(f"label_index {label_index} is out of range for {num_labels} labels")
    return label_index
