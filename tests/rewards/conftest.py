"""Fixtures for the reward tests: tiny random sequence classifiers saved to disk (a text
one, and a Gemma3 one with a processor that sees images) and a real HTTP reward server on
loopback (the tokenizer and engines come from tests/conftest)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification
from vision_classifier import build_vision_classifier

from loomrl.models import DEFAULT_MODEL, resolve

# -- a tiny sequence classifier ------------------------------------------------------------


def build_classifier(
    out: Path,
    tokenizer,
    seed: int,
    *,
    num_labels: int = 1,
    padding_side: str = "right",
    bare: bool = False,
) -> Path:
    """A 2-layer random LlamaForSequenceClassification, a pure function of ``seed``.

    ``bare``: no pad token anywhere and no chat template (to test the errors they cause).
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=96,
        num_labels=num_labels,
        pad_token_id=None if bare else tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    config_file = out / "tokenizer_config.json"
    settings = json.loads(config_file.read_text())
    settings["padding_side"] = padding_side  # what a left-padding reward model ships with
    if bare:
        settings.pop("pad_token")
        (out / "chat_template.jinja").unlink()
    config_file.write_text(json.dumps(settings))
    return out


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory, tokenizer) -> Path:
    return build_classifier(tmp_path_factory.mktemp("rm-seed0"), tokenizer, seed=0)


@pytest.fixture(scope="session")
def make_classifier(tmp_path_factory, tokenizer) -> Callable[..., Path]:
    def make(seed: int = 0, **kwargs: Any) -> Path:
        return build_classifier(
            tmp_path_factory.mktemp(f"rm-seed{seed}"), tokenizer, seed, **kwargs
        )

    return make


@pytest.fixture(scope="session")
def vision_classifier_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vision-rm-seed0")
    return build_vision_classifier(out, resolve(DEFAULT_MODEL), seed=0)


# -- a real HTTP reward server on 127.0.0.1 ------------------------------------------------


@dataclass
class Reply:
    """One planned answer: ``body`` None means the computed scores as JSON."""

    status: int = 200
    body: bytes | None = None
    delay_s: float = 0.0


@dataclass
class RewardServer:
    url: str
    plan: deque[Reply] = field(default_factory=deque)
    token: str | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    score: Callable[[dict[str, Any]], float] = lambda item: float(len(item["completion"]))

    def then(
        self, status: int = 200, body: bytes | str | None = None, delay_s: float = 0.0
    ) -> None:
        """Plan the answer to the next request (unplanned requests get computed scores)."""
        self.plan.append(Reply(status, body.encode() if isinstance(body, str) else body, delay_s))


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:
        state: RewardServer = self.server.state
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        auth = self.headers.get("Authorization")
        state.requests.append({"auth": auth, "path": self.path, "body": json.loads(raw)})
        reply = state.plan.popleft() if state.plan else Reply()
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if state.token is not None and auth != f"Bearer {state.token}":
            # Echo what was sent, as careless servers do: the client must redact it.
            return self._send(401, json.dumps({"error": f"bad credentials {auth}"}).encode())
        body = reply.body
        if body is None:
            items = json.loads(raw)["items"]
            body = json.dumps({"scores": [state.score(item) for item in items]}).encode()
        self._send(reply.status, body)

    def _send(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def reward_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    host, port = httpd.server_address[:2]
    httpd.state = RewardServer(url=f"http://{host}:{port}/score")
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield httpd.state
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.fixture
def dead_url() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/score"
