"""Requests with images for ``RemoteEngine``: vLLM's token-in/token-out route.

vLLM 0.32's ``/v1/completions`` takes token ids or text, never images beside them (its
request has no ``multi_modal_data``), and ``/v1/chat/completions`` renders messages
itself, so neither is token-exact with images. ``/inference/v1/generate`` is: it takes
``token_ids`` plus ``content_parts`` (``{"type": "image_url", "url": DATA_URL}``) and the
server builds ``TokensPrompt(prompt_token_ids=..., multi_modal_data={"image": [...]})``,
the prompt ``VLLMEngine`` gives ``AsyncLLM.generate``. As there, the ids carry one
placeholder per image (each expanded block folded back: vLLM expands placeholders itself
and misreads expanded ones, see docs/vision.md), and the sampling parameters are vLLM's
own, pinned as ``VLLMEngine`` pins them. The route exists only on a server started with
``--enable-scale-out`` (``loomrl serve`` passes it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from loomrl.engines.base import tokens_left
from loomrl.engines.remote_check import ServerModel
from loomrl.engines.remote_sampling import sampling_fields
from loomrl.types import SamplingParams

GENERATE = "/inference/v1/generate"


class ImageRequests:
    """Builds the image requests of one ``RemoteEngine``: checks the served model can take
    images and loads its image block (from the processor in the run's model directory)
    once, before any request is sent."""

    def __init__(self, url: str, server: ServerModel) -> None:
        where = f"RemoteEngine({url}, model {server.name!r})"
        if server.local_dir is None:
            raise ValueError(
                f"{where} cannot send images: it needs the model's processor here; "
                "pass model=SPEC (the served model's spec or directory)"
            )
        from loomrl.models import is_vision

        if not is_vision(server.local_dir):
            raise ValueError(
                f"{where} has no vision tower: it cannot take images (serve a "
                "vision-language model, e.g. smolvlm-tiny)"
            )
        from loomrl.vision.blocks import ImageBlocks

        self.server = server
        self.blocks = ImageBlocks.for_model(server.local_dir)  # each image's, by its size

    def fold(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> list[int]:
        """``prompt_ids`` with each image's block folded to its placeholder; ``ValueError``
        when blocks and images differ in number or size (never a silent mix-up)."""
        return self.blocks.fold(prompt_ids, images)

    def body(
        self,
        prompt_ids: Sequence[int],
        images: Sequence[Any],
        params: SamplingParams,
        request_id: str,
    ) -> dict[str, Any]:
        """The ``/inference/v1/generate`` body: folded ids, the images as PNG data URLs,
        ``max_tokens`` counted from the expanded ids (the length the engine holds)."""
        from loomrl.vision.images import data_url

        limit = tokens_left(len(prompt_ids), params, self.server.max_model_len)
        sampling = sampling_fields(params, limit)
        return {
            "model": self.server.name,
            "request_id": request_id,
            "token_ids": self.fold(prompt_ids, images),
            "content_parts": [{"type": "image_url", "url": data_url(im)} for im in images],
            "sampling_params": sampling,
            "output_mode": "text",  # the server's text too, as /v1/completions gives
            "stream": True,
        }


@contextlib.contextmanager
def scale_out_hint(url: str, path: str) -> Iterator[None]:
    """Turn the 403 of a server without the generate route into what to do about it."""
    try:
        yield
    except ValueError as exc:
        if path == GENERATE and "(403)" in str(exc):
            raise ValueError(
                f"vLLM server at {url} takes no images: it was started without "
                f"--enable-scale-out (`loomrl serve` passes it), which images need for {GENERATE}"
            ) from None
        raise


def read_choice(choice: Mapping[str, Any]) -> tuple[list[int], list[float], str]:
    """``(token ids, their logprobs, text)`` of one streamed ``text``-mode choice."""
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(entry["logprob"]) for entry in content]
    return list(choice.get("token_ids") or []), logprobs, choice.get("text") or ""


def read_completion_choice(choice: Mapping[str, Any]) -> tuple[list[int], list[float], str]:
    """``(token ids, their logprobs, text)`` of one streamed ``/v1/completions`` choice
    (the text-only requests, beside their image-carrying counterparts above)."""
    logprobs = [float(lp) for lp in (choice.get("logprobs") or {}).get("token_logprobs") or []]
    return list(choice.get("token_ids") or []), logprobs, choice.get("text") or ""
