"""What a vLLM server serves, and whether it is the run's model: ``RemoteEngine.check``.

A server is the run's model when its served name is the run's model spec (``loomrl serve``
names it so) or its model directory is the spec's directory, its vocabulary bound equals
the local model's (vLLM accepts token id ``V - 1`` and refuses ``V``: two requests), and
it tokenises a probe text exactly as the local tokenizer does (``/tokenize``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrl.engines.remote_http import HttpSession, ModelMismatchError, RemoteEngineError

if TYPE_CHECKING:
    import torch

PROBE = "Probe: Hello, world! 12345 naïve café — ünïcödé <tag>\n\tdef f(x): return x**2 # 東京"


@dataclass(frozen=True)
class ServerModel:
    """What ``check()`` learnt: served name, the server's model directory (``root``),
    context length, vocabulary size, the run's local model directory (if known) and
    whether the RL routes (``VLLM_SERVER_DEV_MODE=1``) are on."""

    name: str
    root: str | None
    max_model_len: int
    vocab_size: int
    local_dir: Path | None
    dev_mode: bool

    def torch_dtype(self) -> torch.dtype:
        """The dtype weights are sent in: the local model's serving dtype, else fp32."""
        import torch

        if self.local_dir is None:
            return torch.float32
        try:
            from loomrl.engines.vllm import serving_dtype

            name = serving_dtype(self.local_dir)
        except ImportError:  # no vLLM in this process: the model's own dtype
            name = str(_config(self.local_dir).get("torch_dtype") or "float32")
        value = getattr(torch, name, None)
        return value if isinstance(value, torch.dtype) else torch.float32


async def identify(http: HttpSession, spec: str | None) -> ServerModel:
    """Fetch ``/v1/models`` and, when ``spec`` is given, refuse a server of another model."""
    models = await http.request("GET", "/v1/models")
    cards = (models or {}).get("data") or []
    if not cards:
        raise RemoteEngineError(f"vLLM server at {http.url} serves no model")
    card = cards[0]
    name, root = str(card["id"]), card.get("root")
    max_len = int(card.get("max_model_len") or 0)
    if max_len < 2:
        raise RemoteEngineError(f"vLLM server at {http.url} reports no max_model_len")
    if spec is None:
        local = Path(root) if root and Path(root).is_dir() else None
        vocab = await _server_vocab(http, name)
    else:
        from loomrl.models import resolve

        local = resolve(spec)
        if not _same_model(spec, local, name, root):
            raise ModelMismatchError(
                f"server at {http.url} serves {name!r} ({root}), not {spec!r} ({local}); "
                f"start it with `loomrl serve --model {spec}` or --served-model-name {spec}"
            )
        vocab = _local_vocab(local)
        await _check_vocab(http, name, spec, _local_bound(local, vocab))
        await _check_probe(http, name, spec, local)
    dev_mode = await _has_rl_routes(http)
    return ServerModel(name, root, max_len, vocab, local, dev_mode)


def _same_model(spec: str, local: Path, name: str, root: str | None) -> bool:
    if name == spec:
        return True
    for candidate in (name, root):
        if candidate and Path(candidate).is_dir() and Path(candidate).resolve() == local.resolve():
            return True
    return False


def _config(path: Path) -> dict[str, Any]:
    config = json.loads((path / "config.json").read_text())
    return config if "vocab_size" in config else config.get("text_config", config)


def _local_vocab(path: Path) -> int:
    """The model's vocabulary (its embedding rows), as ``VLLMEngine.vocab_size`` is."""
    return int(_config(path)["vocab_size"])


def _local_bound(path: Path, vocab: int) -> int:
    """One past the largest token id vLLM accepts: the model's or tokenizer's vocabulary."""
    from transformers import AutoTokenizer

    return max(vocab, len(AutoTokenizer.from_pretrained(path)))


async def _accepts(http: HttpSession, name: str, token: int) -> bool:
    """Whether the server takes ``token`` as a prompt (it checks ids before generating)."""
    body = {"model": name, "prompt": [token], "max_tokens": 1, "temperature": 0.0}
    try:
        await http.request("POST", "/v1/completions", json_body=body)
    except ValueError as exc:
        if "out of vocabulary" in str(exc):
            return False
        raise
    return True


async def _server_vocab(http: HttpSession, name: str) -> int:
    """The server's token-id bound, found by bisection (~2 log2 V tiny requests)."""
    hi = 1024
    while await _accepts(http, name, hi - 1):
        hi *= 2
        if hi > 2**24:
            raise RemoteEngineError(f"vLLM server at {http.url} accepts every token id")
    lo = hi // 2 if hi > 1024 else 0  # lo - 1 is accepted (or lo == 0), hi - 1 is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await _accepts(http, name, mid - 1):
            lo = mid
        else:
            hi = mid
    return lo


async def _check_vocab(http: HttpSession, name: str, spec: str, local: int) -> None:
    if await _accepts(http, name, local - 1) and not await _accepts(http, name, local):
        return
    served = await _server_vocab(http, name)
    raise ModelMismatchError(
        f"server at {http.url} serves {name!r} with a vocabulary of {served} tokens; "
        f"{spec!r} has {local}"
    )


async def _check_probe(http: HttpSession, name: str, spec: str, local: Path) -> None:
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(local).encode(PROBE, add_special_tokens=False)
    reply = await http.request(
        "POST", "/tokenize", json_body={"model": name, "prompt": PROBE, "add_special_tokens": False}
    )
    got = list((reply or {}).get("tokens") or [])
    if got != expected:
        i = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
        i = min(len(got), len(expected)) if i is None else i
        raise ModelMismatchError(
            f"server at {http.url} ({name!r}) tokenises a probe text differently from "
            f"{spec!r}'s tokenizer: {len(got)} vs {len(expected)} tokens, first difference "
            f"at token {i}"
        )


async def _has_rl_routes(http: HttpSession) -> bool:
    try:
        await http.request("GET", "/is_paused")
    except RemoteEngineError:
        return False
    return True
