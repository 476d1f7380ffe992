"""``loomrl rollout --env textarena:GAME`` killed with SIGKILL mid-production, then resumed:
the game objects are gone with the process, and each in-flight episode continues from its
logged moves, replayed on a new game from the example's seed (no sample restarts)."""

from __future__ import annotations

import json
import sys
import textwrap

from crash import check_resumed, kill_mid_production
from rich.console import Console

from loomrl.runs import read_trajectories

EXAMPLES, N = 8, 2

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from rich.console import Console
    from transformers import AutoTokenizer
    from loomrl.config import RolloutConfig
    from loomrl.engines import ScriptedEngine
    from loomrl.models import DEFAULT_MODEL, resolve
    from loomrl.run.rollout import resume_config, run_rollout

    tokenizer = AutoTokenizer.from_pretrained(resolve(DEFAULT_MODEL))
    MOVES = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]

    def reply(ids, params):  # the next move of the solution, by the turns so far
        return MOVES[tokenizer.decode(ids).count("<|im_start|>assistant") - 1]

    def make_engine(config):
        return ScriptedEngine(reply, tokenizer=tokenizer, step_base_s=STEP, capacity=8)

    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "resume":
        config = resume_config(out)
    else:
        config = RolloutConfig(
            env="textarena:TowerOfHanoi-v0", examples=EXAMPLES, n=N, concurrency=4,
            max_tokens=16, seed=3, out=out,
        )
    asyncio.run(
        run_rollout(config, Console(quiet=True), resume=mode == "resume", make_engine=make_engine)
    )
    """
)


def child_source(step_s: float) -> str:
    return f"EXAMPLES, N, STEP = {EXAMPLES}, {N}, {step_s}\n" + CHILD


async def test_a_killed_textarena_rollout_continues_its_games_from_their_moves(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(child_source(step_s=0.03))
    run_dir = tmp_path / "run"
    seen = kill_mid_production([sys.executable, str(script), str(run_dir), "start"], run_dir)
    assert seen.finished and len(seen.partial) >= 2

    namespace: dict[str, object] = {}
    source = child_source(step_s=0.0).split("out, mode =")[0]
    exec(compile(source, "child", "exec"), namespace)  # the child's engine code
    from loomrl.run.rollout import resume_config, run_rollout

    await run_rollout(
        resume_config(run_dir), Console(quiet=True), resume=True,
        make_engine=namespace["make_engine"],  # type: ignore[arg-type]
    )  # fmt: skip

    rows = read_trajectories(run_dir / "trajectories.parquet")
    check_resumed(rows, seen, EXAMPLES, N)
    assert all(r["status"] == "terminated" and r["turns"] == 7 for r in rows)
    assert all(r["reward"] == 1.0 for r in rows)  # every game solved, resumed ones too
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["producer/samples_resumed"] >= len(seen.partial)
    assert metrics["producer/samples_restarted"] == 0
