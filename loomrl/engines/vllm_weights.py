"""How ``VLLMEngine`` takes new weights: the full model (through vLLM's weight-transfer
API or a file, ``vllm_sync``) or a LoRA adapter (``lora_adapter``), always between a pause
and a resume.

The pause aborts what is in flight, or with ``keep`` (vLLM's keep mode) freezes it: the
kept requests go on under the new weights after the resume, their KV recomputed with
them (the running requests are preempted when the prefix cache is cleared), and vLLM
labels each output token with the weight version that sampled it, so a kept request's
tokens come back as spans per version (``version_spans``), as exact as an aborted one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrl.engines.lora_adapter import Adapter
from loomrl.engines.vllm_sync import (
    finish_weight_update,
    load_weight_file,
    open_transfer,
    receive_transfer,
    shared_memory_dir,
    update_weights,
)

if TYPE_CHECKING:
    import torch

    from loomrl.engines.transfer_native import NativeLink
    from loomrl.engines.transfer_sender import TransferLink


class EngineWeights:
    """``VLLMEngine``'s weight updates (a mixin: it reads the engine's vLLM client, its
    version, its transfer link and its ``abort``)."""

    _llm: Any
    _policy_version: int
    _link: TransferLink | NativeLink | None
    _updating: asyncio.Event | None
    _adapter: tuple[Any, str] | None  # the loaded LoRARequest and its directory
    _adapter_ids: itertools.count[int]

    if TYPE_CHECKING:

        async def abort(self, request_ids: Any = None) -> list[str]: ...

    @property
    def lora_request(self) -> Any:
        """The vLLM LoRA adapter every request runs with (``None``: the model's weights)."""
        return None if self._adapter is None else self._adapter[0]

    supports_keep = True

    async def update_weights(
        self,
        weights: Mapping[str, torch.Tensor] | Adapter,
        version: int | None = None,
        *,
        keep: bool = False,
    ) -> float:
        """Load new weights (HF parameter names, any float dtype; or a LoRA ``Adapter``)
        into the live engine; returns seconds taken.

        Requests still in flight are aborted first (they end with ``finish_reason="abort"``
        and keep their tokens, all from the old weights), or with ``keep`` continue under
        the new weights (each version's tokens a span of their own); the prefix cache,
        whose KV came from the old weights, is cleared.
        Weights stream through vLLM's weight-transfer API (``weight_sync="transfer"``;
        ``"nccl"``, ``"ipc"`` on GPUs) or go as one file (``"file"``); an adapter is
        loaded as a vLLM LoRA adapter named after its version. ``policy_version`` becomes
        ``version`` (default: one more).
        """
        start = time.perf_counter()
        new = self._policy_version + 1 if version is None else version
        dtype = self._llm.model_config.dtype
        if isinstance(weights, Adapter):
            async with self._paused(new, keep):
                await self._load_adapter(weights, new)
        elif self._link is not None:
            await self._link.push(self, weights, dtype, new, keep=keep)
        else:
            async with self._paused(new, keep):
                await load_weight_file(self._llm, weights, dtype)
        return time.perf_counter() - start

    async def open_transfer(self, init_info: dict[str, Any]) -> int:
        """The workers connect to a trainer's transfer (``TransferLink``)."""
        return await open_transfer(self._llm, init_info)

    async def receive_transfer(
        self, update_info: dict[str, Any], version: int, *, keep: bool = False
    ) -> None:
        """One sync through the transfer, as ``update_weights`` describes."""
        async with self._paused(version, keep):
            await receive_transfer(self._llm, update_info)

    # vLLM's trainer-side engines (NCCL, IPC: ``transfer_native.NativeTarget``) --------------
    def paused_for_sync(self, version: int, keep: bool) -> contextlib.AbstractAsyncContextManager:
        return self._paused(version, keep)

    async def transfer_backend(self) -> str:
        config = self._llm.vllm_config.weight_transfer_config
        return "none" if config is None else str(config.backend)

    async def transfer_workers(self) -> int:
        return int(self._llm.vllm_config.parallel_config.world_size_across_dp)

    async def transfer_init(self, init_info: dict[str, Any]) -> None:
        await open_transfer(self._llm, init_info)

    async def transfer_start(self) -> None:
        await self._llm.start_weight_update()

    async def transfer_update(self, update_info: dict[str, Any]) -> None:
        await update_weights(self._llm, update_info)

    async def transfer_finish(self) -> None:
        await finish_weight_update(self._llm)

    async def _load_adapter(self, adapter: Adapter, version: int) -> None:
        """``adapter`` as the adapter every request runs with; the one before it unloaded."""
        from vllm.lora.request import LoRARequest

        if self._llm.vllm_config.lora_config is None:
            raise ValueError(
                "this engine was started without LoRA: start it with lora_rank= to take "
                "adapters (or sync merged weights)"
            )
        directory = tempfile.mkdtemp(prefix="loomrl-adapter-", dir=shared_memory_dir())
        adapter.save(Path(directory))
        request = LoRARequest(f"loomrl-policy-{version}", next(self._adapter_ids), directory)
        try:
            await self._llm.add_lora(request)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        old, self._adapter = self._adapter, (request, directory)
        if old is not None:
            await self._llm.remove_lora(old[0].lora_int_id)
            shutil.rmtree(old[1], ignore_errors=True)

    def _drop_adapter_files(self) -> None:
        if self._adapter is not None:
            shutil.rmtree(self._adapter[1], ignore_errors=True)

    @contextlib.asynccontextmanager
    async def _paused(self, version: int, keep: bool) -> AsyncIterator[None]:
        """Generation stopped (in-flight requests aborted, or kept; new ones held) around
        a load; after a load that succeeded, the new ``version`` labels what is sampled
        from now on and the prefix cache is cleared (kept requests recompute their KV)."""
        self._updating = asyncio.Event()
        if not keep:
            await self.abort()
        await self._llm.pause_generation(mode="keep" if keep else "abort", clear_cache=not keep)
        try:
            yield
            await self._llm.update_weight_version(str(version))
            await self._llm.reset_prefix_cache(reset_running_requests=keep)
            self._policy_version = version
        finally:
            await self._llm.resume_generation()
            self._updating.set()
            self._updating = None


def version_spans(
    spans: list[Any] | None, first: int, count: int
) -> list[tuple[int, int, int]] | None:
    """``(start, end, policy version)`` per run of a completion's tokens sampled by one
    weight version (vLLM's ``weight_versions``), or None when vLLM labelled none; tokens
    before any label (and the label ``default``) are ``first``'s, the version the request
    started under. A request kept through a sync before its first token has one span,
    of the new version."""
    if not spans:
        return None
    pieces = [(s.start, s.end, first if s.version == "default" else int(s.version)) for s in spans]
    if pieces[0][0] > 0:
        pieces.insert(0, (0, pieces[0][0], first))
    if pieces[-1][1] != count:
        raise RuntimeError(f"vLLM's weight versions cover {pieces[-1][1]} of {count} tokens")
    return pieces
