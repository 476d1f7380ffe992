"""What the TextArena adapter costs: ``textarena:TowerOfHanoi-v0`` against a native env that
answers with the very same texts (so both roll out the same turns and the same tokens).

A scripted player solves the puzzle in 7 moves. The engine is ScriptedEngine with the
continuous-batching cost model of ``rollout_modes.py`` (fitted to vLLM on this CPU, x0.1)
and, for the worst case, with no cost at all (pure orchestration). Runs alternate between
the two envs; the table has the medians.

    python benchmarks/textarena_overhead.py [--episodes N] [--runs R] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from _report import write_section
from transformers import AutoTokenizer

import loomrl
from loomrl.engines import ScriptedEngine
from loomrl.envs.base import Environment, EnvState, EnvStep, Message, make_dataset
from loomrl.models import DEFAULT_MODEL, resolve

GAME = "textarena:TowerOfHanoi-v0"
MOVES = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


class Replay(Environment):
    """The texts one TextArena episode showed, replayed by a native env."""

    name = "replay"
    max_turns = 28
    nonblocking = True

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return make_dataset(n, seed, lambda rng: {"seed": rng.randrange(2**31)})

    def reset(self, example: dict[str, Any]) -> EnvState:
        return EnvState([{"role": "user", "content": self.texts[0]}], example)

    def step(self, state: EnvState, message: Message) -> EnvStep:
        done = state.turn == len(MOVES)
        reply = [{"role": "user", "content": self.texts[state.turn]}]
        return EnvStep(reply, done=done, reward=1.0 if done else None)

    def score(self, state: EnvState) -> float:
        return 1.0


def texts_of(env: Environment) -> list[str]:
    state = env.reset({"id": 0, "seed": 0})
    steps = [env.step(state, {"role": "assistant", "content": m}) for m in MOVES]
    return [state.messages[0]["content"]] + [s.messages[0]["content"] for s in steps]


async def timed(
    env: Environment, tokenizer: Any, episodes: int, scale: float
) -> tuple[float, float]:
    """``(wall s, CPU s)`` of one rollout (CPU time is steadier on a shared machine)."""

    def reply(ids: Any, _params: Any) -> str:  # the move number is the turns so far
        return MOVES[tokenizer.decode(ids).count("<|im_start|>assistant") - 1]

    engine = ScriptedEngine(
        reply, tokenizer=tokenizer, step_base_s=0.05 * scale, step_per_seq_s=0.0012 * scale,
        prefill_per_token_s=0.00002 * scale, capacity=64,
    )  # fmt: skip
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    trajs = await loomrl.rollout(engine, env, env.dataset(episodes), concurrency=64)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    await engine.close()
    assert all(t.turns == len(MOVES) and t.reward == 1.0 for t in trajs)
    return wall, cpu


async def main(args: argparse.Namespace) -> str:
    tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    adapter = loomrl.envs.load(GAME)
    native = Replay(texts_of(adapter))
    rows = []
    for scale in (0.1, 0.0):
        runs: dict[str, list[tuple[float, float]]] = {"native": [], "textarena": []}
        for _ in range(args.runs):
            runs["native"].append(await timed(native, tokenizer, args.episodes, scale))
            runs["textarena"].append(await timed(adapter, tokenizer, args.episodes, scale))
        (wall_a, cpu_a), (wall_b, cpu_b) = (
            tuple(statistics.median(x) for x in zip(*runs[k], strict=True))
            for k in ("native", "textarena")
        )
        label = f"cost model x{scale}" if scale else "zero-cost engine"
        rows.append(
            f"| {label} | {wall_a:.3f} | {wall_b:.3f} | {100 * (wall_b / wall_a - 1):+.1f}% "
            f"| {cpu_a:.3f} | {cpu_b:.3f} | {100 * (cpu_b / cpu_a - 1):+.1f}% |"
        )
    turns = args.episodes * len(MOVES)
    return "\n".join(
        [
            f"`{GAME}` solved by a scripted player ({args.episodes} episodes x "
            f"{len(MOVES)} turns = {turns} turns, concurrency 64) against a native env "
            f"replaying the same texts; medians of {args.runs} alternating runs (wall seconds, "
            "and the process's CPU seconds).",
            "",
            "| engine | native wall | textarena wall | overhead | native CPU | textarena CPU "
            "| overhead |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    cli_args = parser.parse_args()
    body = asyncio.run(main(cli_args))
    print(body)
    if cli_args.write:
        write_section("TextArena adapter overhead", body)
