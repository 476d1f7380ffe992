"""New weights into a remote vLLM server, through a file both sides can read.

``load_weights`` writes a safetensors file under ``/dev/shm`` and asks the server
(``/collective_rpc`` ``loomrl_load_weights``, the worker extension ``loomrl serve``
installs) to read it, so the trainer and the server must share that filesystem. Pausing
the server and stamping the new policy version are ``RemoteEngine.update_weights``'s part.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

from loomrl.engines.remote_http import HttpSession, RemoteEngineError

if TYPE_CHECKING:
    import torch


async def load_weights(
    http: HttpSession, url: str, weights: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> None:
    """Write ``weights`` (cast to ``dtype``) to a shared-memory file the server reads."""
    from safetensors.torch import save_file

    from loomrl.engines.vllm import _checkpoint_tensors, _shared_memory_dir

    with tempfile.TemporaryDirectory(dir=_shared_memory_dir()) as tmp:
        os.chmod(tmp, 0o755)  # the server may run as another user
        path = os.path.join(tmp, "weights.safetensors")
        save_file(_checkpoint_tensors(weights, dtype), path)
        os.chmod(path, 0o644)
        await _read_on_server(http, url, path)


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
