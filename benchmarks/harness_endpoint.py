"""What does the harness endpoint cost per request, against a direct engine call?

The same 8-turn conversation is played two ways on a zero-cost scripted engine (so the
numbers are orchestration only), one episode at a time:

- **direct**: ``loomrl.rollout`` over an environment that answers every model turn with
  a fixed user message (the turn loop calls the engine itself); its cost per turn is
  the wall time of an episode over its turns;
- **harness**: ``HarnessEnv`` whose program sends the same conversation as OpenAI chat
  requests to the loopback endpoint; each request's round trip is timed by the program.
  Three clients: a minimal keep-alive HTTP/1.1 client (``raw``: what the endpoint
  itself costs), ``httpx`` (one keep-alive client per episode), and the official
  ``openai`` SDK.

Overhead per request = the request's round trip - the direct turn (both p50 / p90 over
all requests or turns of a round, median over ``--repeats`` rounds run side by side:
this machine is noisy). The round trip holds the whole turn (generation, glue, the
session's prefix match) plus HTTP and JSON on both sides; the client rows add that
client's own cost, which an agent pays whichever server it talks to. Episode set-up (the
program's start, the server's start when no episode is open) is not in these numbers.

    python benchmarks/harness_endpoint.py [--episodes 100] [--turns 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
from transformers import AutoTokenizer

import loomrl
from loomrl.engines import ScriptedEngine
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.harness import HarnessEnv, HarnessRun
from loomrl.models import DEFAULT_MODEL, resolve

NUDGE = "Go on."
REPLY = "Let me think about this a little more."


class Nudging(Environment):
    """Answers each turn with the same user message; ends after ``turns`` turns."""

    name = "nudging"
    nonblocking = True

    def __init__(self, turns: int) -> None:
        self.max_turns = turns

    def step(self, state: EnvState, message: dict[str, Any]) -> EnvStep:
        done = state.turn >= self.max_turns
        return EnvStep(messages=[] if done else [{"role": "user", "content": NUDGE}], done=done)

    def score(self, state: EnvState) -> float:
        return 0.0


Timings = list[float]


class RawClient:
    """HTTP/1.1 over one keep-alive connection, nothing else: the endpoint's own cost."""

    def __init__(self, base_url: str) -> None:
        self.url = urlsplit(base_url)
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.url.hostname, self.url.port)
        reader, writer = self.streams
        data = json.dumps(body).encode()
        head = (
            f"POST {self.url.path}{path} HTTP/1.1\r\nHost: {self.url.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        writer.write(head.encode() + data)
        headers = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        length = int(headers.split("content-length:")[1].split("\r\n")[0])
        return json.loads(await reader.readexactly(length))

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


def conversation_agent(client_kind: str, turns: int, timings: Timings):
    """A program playing ``turns`` turns with ``client_kind``, timing each request."""

    async def agent(run: HarnessRun) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": run.example["question"]}]
        if client_kind == "raw":
            raw = RawClient(run.base_url)
            send = functools.partial(raw.post, "/chat/completions")
        elif client_kind == "httpx":
            headers = {"Authorization": f"Bearer {run.api_key}"}
            http = httpx.AsyncClient(base_url=run.base_url, headers=headers)

            async def send(body: dict[str, Any]) -> dict[str, Any]:
                return (await http.post("/chat/completions", json=body)).json()
        else:
            sdk = run.client()

            async def send(body: dict[str, Any]) -> dict[str, Any]:
                reply = await sdk.chat.completions.create(model=run.model, **body)
                return {
                    "choices": [
                        {
                            "message": {
                                "role": "assistant",
                                "content": reply.choices[0].message.content,
                            }
                        }
                    ]
                }

        try:
            for turn in range(turns):
                start = time.perf_counter()
                answer = await send({"messages": messages})
                timings.append(time.perf_counter() - start)
                messages.append(answer["choices"][0]["message"])
                if turn + 1 < turns:
                    messages.append({"role": "user", "content": NUDGE})
        finally:
            if client_kind == "raw":
                raw.close()
            elif client_kind == "httpx":
                await http.aclose()
            else:
                await sdk.close()
        return 0.0

    return agent


async def play(engine: Any, env: Environment, episodes: int, turns: int, timings: Timings) -> None:
    """``episodes`` episodes one at a time; a direct env's turns are timed here."""
    for i in range(episodes):
        start = time.perf_counter()
        [traj] = await loomrl.rollout(engine, env, [{"id": i, "question": "Count to three."}])
        assert traj.turns == turns and traj.error is None, (traj.status, traj.error)
        if isinstance(env, Nudging):
            timings += [(time.perf_counter() - start) / turns] * turns


def quantile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q * 100) - 1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    engine = ScriptedEngine(lambda prompt, params: REPLY, tokenizer=tokenizer)
    timings: dict[str, Timings] = {}
    modes: dict[str, Environment] = {"direct": Nudging(args.turns)}
    for kind in ("raw", "httpx", "openai SDK"):
        timings[kind] = []
        agent = conversation_agent(kind, args.turns, timings[kind])
        modes[kind] = HarnessEnv(agent, reward=lambda outcome: 0.0)
    timings["direct"] = []
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    for warm_up in (True,) + (False,) * args.repeats:
        for name, env in modes.items():
            timings[name].clear()
            await play(engine, env, 5 if warm_up else args.episodes, args.turns, timings[name])
            if not warm_up:
                rounds[name].append((quantile(timings[name], 0.5), quantile(timings[name], 0.9)))
    await engine.close()
    base50 = statistics.median(p50 for p50, _ in rounds["direct"])
    base90 = statistics.median(p90 for _, p90 in rounds["direct"])
    print(f"\n{args.episodes} episodes x {args.turns} turns, one at a time; ", end="")
    print(f"median of {args.repeats} rounds\n")
    print("| mode | per request (turn) p50 | p90 | overhead per request p50 | p90 |")
    print("|---|---|---|---|---|")
    for name, values in rounds.items():
        p50 = statistics.median(v for v, _ in values)
        p90 = statistics.median(v for _, v in values)
        label = name if name == "direct" else f"harness, {name} client"
        print(
            f"| {label} | {p50 * 1e3:.2f} ms | {p90 * 1e3:.2f} ms | "
            f"{(p50 - base50) * 1e3:+.2f} ms | {(p90 - base90) * 1e3:+.2f} ms |"
        )


if __name__ == "__main__":
    asyncio.run(main())
