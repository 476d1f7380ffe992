"""New weights into a remote vLLM server: through vLLM's weight-transfer routes, or a file.

``open_transfer`` and ``receive_transfer`` drive the server's side of loomrl's transfer
(``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``; the ``loomrl_tcp`` backend ``loomrl serve`` configures): the
tensors come over a TCP connection the server's workers open to the trainer, so the two
may run on different hosts. ``load_weights`` is the file fallback: it writes a
safetensors file under ``/dev/shm`` and asks the server (``/collective_rpc``
``loomrl_load_weights``) to read it, so the trainer and the server must share that
filesystem. Pausing the server and stamping the new policy version are
``RemoteEngine``'s part.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loomrl.engines.remote_check import ServerModel
from loomrl.engines.remote_http import HttpSession, RemoteEngineError

if TYPE_CHECKING:
    import torch

TRANSFER_TIMEOUT_S = 3600.0


async def load_weights(
    http: HttpSession, url: str, weights: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> None:
    """Write ``weights`` (cast to ``dtype``) to a shared-memory file the server reads."""
    from safetensors.torch import save_file

    from loomrl.engines.vllm_sync import checkpoint_tensors, shared_memory_dir

    with tempfile.TemporaryDirectory(dir=shared_memory_dir()) as tmp:
        os.chmod(tmp, 0o755)  # the server may run as another user
        path = os.path.join(tmp, "weights.safetensors")
        save_file(checkpoint_tensors(weights, dtype), path)
        os.chmod(path, 0o644)
        await _read_on_server(http, url, path)


def require_rl_routes(server: ServerModel, url: str, weights: object) -> ServerModel:
    """``server``, unless it lacks the RL routes a weight update needs or ``weights`` are
    not the full model's (a LoRA adapter would be read from the server's own disk)."""
    if not isinstance(weights, Mapping):
        raise RemoteEngineError(
            f"vLLM server at {url} takes the full model's weights, not a "
            f"{type(weights).__name__}: sync LoRA as merged weights (lora.sync = 'merged')"
        )
    if not server.dev_mode:
        raise RemoteEngineError(
            f"vLLM server at {url} has no RL routes (/pause, /collective_rpc): start "
            "it with VLLM_SERVER_DEV_MODE=1 (`loomrl serve` does)"
        )
    return server


async def open_transfer(http: HttpSession, url: str, init_info: dict[str, Any]) -> int:
    """Have the server's workers connect to the trainer; returns how many there are."""
    try:
        await http.request(
            "POST", "/init_weight_transfer_engine", json_body={"init_info": init_info},
            timeout=TRANSFER_TIMEOUT_S,
        )  # fmt: skip
    except (RemoteEngineError, ValueError) as exc:  # vLLM answers 400 or 500
        if "weight_transfer_config" in str(exc) or "loomrl_tcp" in str(exc):
            raise RemoteEngineError(
                f"vLLM server at {url} has no loomrl weight transfer: start it with "
                '`loomrl serve` (--weight-transfer-config \'{"backend": "loomrl_tcp"}\'), '
                'or sync through a shared file with weight_sync = "file"'
            ) from None
        raise
    reply = await http.request("GET", "/get_world_size")
    return int(reply["world_size"])


async def receive_transfer(http: HttpSession, update_info: dict[str, Any]) -> None:
    """One sync's tensors into the paused server, with the caches the old weights filled
    (encoder outputs of images, LoRA state) cleared after."""
    await http.request("POST", "/start_weight_update")
    await _update(http, update_info)
    await _finish(http)


async def _update(http: HttpSession, update_info: dict[str, Any]) -> None:
    body = {"update_info": update_info}
    await http.request("POST", "/update_weights", json_body=body, timeout=TRANSFER_TIMEOUT_S)


async def _finish(http: HttpSession) -> None:
    await http.request("POST", "/finish_weight_update")
    await http.request("POST", "/collective_rpc", json_body={"method": "loomrl_reset_caches"})


class RemoteTransfer:
    """``RemoteEngine``'s side of a transfer over the server's RL routes: loomrl_tcp's
    (``TransferLink``: ``open_transfer``, ``receive_transfer``) and the control calls of
    vLLM's trainer-side engines (``NativeLink``, NCCL: ``transfer_*``)."""

    _http: HttpSession
    url: str

    if TYPE_CHECKING:

        def _paused(self, version: int) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def open_transfer(self, init_info: dict[str, Any]) -> int:
        """The server's workers connect to a trainer's transfer (``TransferLink``)."""
        return await open_transfer(self._http, self.url, init_info)

    async def receive_transfer(
        self, update_info: dict[str, Any], version: int, *, keep: bool = False
    ) -> None:
        """One sync through the transfer, as ``update_weights`` describes (never ``keep``:
        the OpenAI routes do not say which weights sampled which token)."""
        async with self._paused(version):
            await receive_transfer(self._http, update_info)

    def paused_for_sync(self, version: int, keep: bool) -> contextlib.AbstractAsyncContextManager:
        return self._paused(version)  # never kept, as above

    async def transfer_backend(self) -> str:
        reply = await self._http.request("GET", "/server_info", params={"config_format": "json"})
        config = (reply or {}).get("vllm_config") or {}
        transfer = config.get("weight_transfer_config") if isinstance(config, dict) else None
        return str(transfer.get("backend")) if isinstance(transfer, dict) else "none"

    async def transfer_workers(self) -> int:
        reply = await self._http.request("GET", "/get_world_size")
        return int(reply["world_size"])

    async def transfer_init(self, init_info: dict[str, Any]) -> None:
        await self._http.request(
            "POST", "/init_weight_transfer_engine", json_body={"init_info": init_info},
            timeout=TRANSFER_TIMEOUT_S,
        )  # fmt: skip

    async def transfer_start(self) -> None:
        await self._http.request("POST", "/start_weight_update")

    async def transfer_update(self, update_info: dict[str, Any]) -> None:
        body = {"update_info": update_info}
        await self._http.request(
            "POST", "/update_weights", json_body=body, timeout=TRANSFER_TIMEOUT_S
        )

    async def transfer_finish(self) -> None:
        await self._http.request("POST", "/finish_weight_update")
        await self._http.request(
            "POST", "/collective_rpc", json_body={"method": "loomrl_reset_caches"}
        )


async def _read_on_server(http: HttpSession, url: str, path: str) -> None:
    body = {"method": "loomrl_load_weights", "args": [path]}
    try:
        await http.request("POST", "/collective_rpc", json_body=body, timeout=3600)
    except RemoteEngineError as exc:
        if "loomrl_load_weights" in str(exc) and "attribute" in str(exc):
            raise RemoteEngineError(
                f"vLLM server at {url} has no loomrl weight loader: start it with "
                "`loomrl serve` (--worker-extension-cls "
                "loomrl.engines.vllm_worker.WeightLoader)"
            ) from None
        if "No such file" in str(exc):
            raise RemoteEngineError(
                f"vLLM server at {url} cannot read the weight file {path}: the "
                "server and the trainer must share a filesystem"
            ) from None
        raise


async def reset_prefix_cache(http: HttpSession, url: str) -> None:
    """Clear the server's prefix cache, retrying while blocks are held (an abort still
    draining)."""
    for _ in range(50):
        reply = await http.request("POST", "/reset_prefix_cache")
        if reply is None or reply.get("success", True):
            return
        await asyncio.sleep(0.1)
    raise RemoteEngineError(f"vLLM server at {url} could not clear its prefix cache")
