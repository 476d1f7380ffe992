"""RemoteEngine with images against a fake vLLM server: they go to
``/inference/v1/generate`` with one placeholder per image and the images as data URLs,
the streamed text-mode chunks become one Completion, and every mistake (blocks that miss
images, a text-only model, a server without the route) is refused in one clear line,
before any generation request when it can be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from loomrl.engines.remote import RemoteEngine
from loomrl.engines.serve import server_command
from loomrl.models import resolve
from loomrl.types import SamplingParams
from loomrl.vision.images import load_image
from loomrl.vision.tokens import image_block

from .test_remote import URL, FakeServer

IMAGE = 49153  # smolvlm-tiny's <image>
PARAMS = SamplingParams(max_tokens=500, temperature=0.0)
CHUNKS = [
    {"index": 0, "token_ids": [504], "text": "The", "finish_reason": None,
     "logprobs": {"content": [{"token": "The", "logprob": -1.5, "top_logprobs": []}]}},
    {"index": 0, "token_ids": [2798, 2], "text": " red", "finish_reason": "stop",
     "stop_reason": None, "logprobs": {"content": [{"token": " red", "logprob": -0.25},
                                                   {"token": "", "logprob": -0.5}]}},
]  # fmt: skip


@pytest.fixture(scope="module")
def vlm() -> Path:
    return resolve("smolvlm-tiny")


@pytest.fixture(scope="module")
def block(vlm) -> tuple[int, ...]:
    from transformers import AutoProcessor

    return image_block(AutoProcessor.from_pretrained(vlm))[1]


class VisionServer(FakeServer):
    """The fake server with a model directory (``root``) and the generate route; a
    server without ``scale_out`` answers that route 403, as vLLM does."""

    def __init__(self, root: Path | str, *, scale_out: bool = True, **kwargs: Any) -> None:
        super().__init__(vocab=49156, max_len=1024, **kwargs)
        self.root, self.scale_out = str(root), scale_out

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            self.calls.append((request.method, path, None))
            card = {"id": self.name, "root": self.root, "max_model_len": self.max_len}
            return httpx.Response(200, json={"data": [card]})
        if path != "/inference/v1/generate":
            return await super().handle(request)
        self.calls.append((request.method, path, json.loads(request.content)))
        if not self.scale_out:
            message = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out"
            return httpx.Response(403, json={"error": {"message": message, "code": 403}})
        events = [
            f"data: {json.dumps({'choices': [c], 'output_mode': 'text'})}\n\n" for c in CHUNKS
        ]
        return httpx.Response(200, content="".join([*events, "data: [DONE]\n\n"]).encode())

    def sent(self) -> list[dict[str, Any]]:
        return [body for _, path, body in self.calls if path == "/inference/v1/generate"]


def engine_for(server: VisionServer) -> RemoteEngine:
    return RemoteEngine(URL, transport=server.transport(), retry_backoff_s=0.001)


def pictures() -> list[Image.Image]:
    return [Image.new("RGB", (64, 64), (200, 30, 30)), Image.new("RGB", (32, 48), (0, 0, 255))]


def with_blocks(block: tuple[int, ...]) -> list[int]:
    return [1, 4093, 198, *block, 1780, *block, 7302, 198]


async def test_images_go_to_the_generate_route_with_one_placeholder_each(vlm, block):
    server = VisionServer(vlm)
    ids, images = with_blocks(block), pictures()
    async with engine_for(server) as engine:
        assert engine.vision and engine.model_path == vlm  # the rollout renders with images
        out = await engine.generate(ids, PARAMS, "traj-1:0", images=images)
        text = await engine.generate([1, 4093, 198], SamplingParams(max_tokens=3), "t:0")
    (body,) = server.sent()
    assert body["token_ids"] == [1, 4093, 198, IMAGE, 1780, IMAGE, 7302, 198]
    assert body["request_id"] == "traj-1:0" and body["model"] == "fake-model"
    urls = [part["url"] for part in body["content_parts"]]
    assert [part["type"] for part in body["content_parts"]] == ["image_url"] * 2
    for url, image in zip(urls, images, strict=True):
        assert url.startswith("data:image/png;base64,")
        assert load_image(url).tobytes() == image.tobytes()  # the same pixels, in order
    sampling = body["sampling_params"]
    assert sampling["max_tokens"] == 500 and sampling["logprobs"] == 0
    assert sampling["include_stop_str_in_output"] is True and sampling["temperature"] == 0.0
    assert (body["output_mode"], body["stream"]) == ("text", True)
    assert out.token_ids == [504, 2798, 2] and out.logprobs == [-1.5, -0.25, -0.5]
    assert (out.text, out.finish_reason, out.prompt_len) == ("The red", "stop", len(ids))
    assert text.finish_reason == "stop" and len(server.sent()) == 1  # text: /v1/completions


async def test_max_tokens_counts_the_expanded_prompt(vlm, block):
    server = VisionServer(vlm)
    ids = with_blocks(block)
    async with engine_for(server) as engine:
        await engine.generate(ids, SamplingParams(max_tokens=5000), images=pictures())
    assert server.sent()[0]["sampling_params"]["max_tokens"] == 1024 - len(ids)


async def test_blocks_that_miss_images_are_refused_before_any_request(vlm, block):
    server = VisionServer(vlm)
    async with engine_for(server) as engine:
        with pytest.raises(ValueError, match="placeholder id at 25 outside the blocks of its 1"):
            await engine.generate(with_blocks(block), PARAMS, images=pictures()[:1])
        with pytest.raises(ValueError, match="0 image blocks for 1 images"):
            await engine.generate([1, 4093, 198], PARAMS, images=pictures()[:1])
    assert server.sent() == []


async def test_a_text_only_model_refuses_images_before_any_request(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for root, match in [
        (tmp_path, r"model 'fake-model'.* has no vision tower: it cannot take images"),
        ("/nowhere", r"cannot send images: it needs the model's processor here; pass model="),
    ]:
        server = VisionServer(root)
        async with engine_for(server) as engine:
            with pytest.raises(ValueError, match=match):
                await engine.generate([1, 2, 3], PARAMS, images=pictures()[:1])
        assert server.sent() == []


async def test_a_server_without_the_generate_route_says_how_to_start_it(vlm, block):
    server = VisionServer(vlm, scale_out=False)
    async with engine_for(server) as engine:
        with pytest.raises(ValueError, match="takes no images: it was started without --enable-sc"):
            await engine.generate(with_blocks(block), PARAMS, images=pictures())
        assert engine.in_flight == 0


def test_loomrl_serve_turns_the_generate_route_on(vlm):
    assert "--enable-scale-out" in server_command("smolvlm-tiny", model_dir=vlm)
