"""How ``VLLMEngine`` takes new weights: the full model (through vLLM's weight-transfer
API or a file, ``vllm_sync``) or a LoRA adapter (``lora_adapter``), always between a pause
that aborts what is in flight and a resume.
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
    load_weight_file,
    open_transfer,
    receive_transfer,
    shared_memory_dir,
)

if TYPE_CHECKING:
    import torch

    from loomrl.engines.transfer_sender import TransferLink


class EngineWeights:
    """``VLLMEngine``'s weight updates (a mixin: it reads the engine's vLLM client, its
    version, its transfer link and its ``abort``)."""

    _llm: Any
    _policy_version: int
    _link: TransferLink | None
    _updating: asyncio.Event | None
    _adapter: tuple[Any, str] | None  # the loaded LoRARequest and its directory
    _adapter_ids: itertools.count[int]

    if TYPE_CHECKING:

        async def abort(self, request_ids: Any = None) -> list[str]: ...

    @property
    def lora_request(self) -> Any:
        """The vLLM LoRA adapter every request runs with (``None``: the model's weights)."""
        return None if self._adapter is None else self._adapter[0]

    async def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Adapter, version: int | None = None
    ) -> float:
        """Load new weights (HF parameter names, any float dtype; or a LoRA ``Adapter``)
        into the live engine; returns seconds taken.

        Requests still in flight are aborted first (they end with ``finish_reason="abort"``
        and keep their tokens, all from the old weights: versions never mix within a
        generation); the prefix cache, whose KV came from the old weights, is cleared.
        Weights stream through vLLM's weight-transfer API (``weight_sync="transfer"``) or
        go as one file (``"file"``); an adapter is loaded as a vLLM LoRA adapter named
        after its version. ``policy_version`` becomes ``version`` (default: one more).
        """
        start = time.perf_counter()
        new = self._policy_version + 1 if version is None else version
        dtype = self._llm.model_config.dtype
        if isinstance(weights, Adapter):
            async with self._paused():
                await self._load_adapter(weights, new)
                self._policy_version = new
        elif self._link is not None:
            await self._link.push(self, weights, dtype, new)
        else:
            async with self._paused():
                await load_weight_file(self._llm, weights, dtype)
                self._policy_version = new
        return time.perf_counter() - start

    async def open_transfer(self, init_info: dict[str, Any]) -> int:
        """The workers connect to a trainer's transfer (``TransferLink``)."""
        return await open_transfer(self._llm, init_info)

    async def receive_transfer(self, update_info: dict[str, Any], version: int) -> None:
        """One sync through the transfer, as ``update_weights`` describes."""
        async with self._paused():
            await receive_transfer(self._llm, update_info)
            self._policy_version = version

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
    async def _paused(self) -> AsyncIterator[None]:
        """Generation stopped (in-flight requests aborted, new ones held) around a load;
        the prefix cache cleared after a load that succeeded."""
        self._updating = asyncio.Event()
        await self.abort()
        await self._llm.pause_generation(mode="abort", clear_cache=True)
        try:
            yield
            await self._llm.reset_prefix_cache()
        finally:
            await self._llm.resume_generation()
            self._updating.set()
            self._updating = None
