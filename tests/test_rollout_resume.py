"""``loomrl rollout`` killed with SIGKILL mid-production, then resumed.

A child process runs the real rollout command function (run directory, buffer log,
producer) with a scripted engine slow enough to be caught mid-episode; the test kills it
once some groups have finished and some samples are checkpointed mid-episode, resumes the
run, and checks that every example's group appears exactly once, that finished groups
were kept as they were, and that in-flight samples were continued from their prefix.
"""

from __future__ import annotations

import json
import sys
import textwrap

from crash import check_resumed, kill_mid_production
from rich.console import Console

from loomrl.runs import read_trajectories

EXAMPLES, N = 12, 2

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

    def reply(ids, params):
        return "my guess is %d" % ((len(ids) * 7) % 50 + 1)  # a function of the prefix

    def make_engine(config):
        return ScriptedEngine(reply, tokenizer=tokenizer, step_base_s=STEP, capacity=8)

    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "resume":
        config = resume_config(out)
    else:
        config = RolloutConfig(
            env="guess_number", examples=EXAMPLES, n=N, concurrency=4, max_tokens=16,
            seed=3, out=out,
        )
    asyncio.run(
        run_rollout(config, Console(quiet=True), resume=mode == "resume", make_engine=make_engine)
    )
    """
)


def child_source(step_s: float) -> str:
    return f"EXAMPLES, N, STEP = {EXAMPLES}, {N}, {step_s}\n" + CHILD


async def test_sigkilled_rollout_resumes_without_loss_duplication_or_restart(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(child_source(step_s=0.03))
    run_dir = tmp_path / "run"
    seen = kill_mid_production([sys.executable, str(script), str(run_dir), "start"], run_dir)
    assert not (run_dir / "trajectories.parquet").exists()
    assert seen.finished and len(seen.partial) >= 2

    # Resume in this process, through the same command function the CLI calls.
    namespace: dict[str, object] = {}
    source = child_source(step_s=0.0).split("out, mode =")[0]
    exec(compile(source, "child", "exec"), namespace)  # the child's engine and config code
    from loomrl.run.rollout import resume_config, run_rollout

    await run_rollout(
        resume_config(run_dir), Console(quiet=True), resume=True,
        make_engine=namespace["make_engine"],  # type: ignore[arg-type]
    )  # fmt: skip

    check_resumed(read_trajectories(run_dir / "trajectories.parquet"), seen, EXAMPLES, N)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["producer/groups_launched"] == EXAMPLES  # no example drawn twice
    assert metrics["producer/samples_resumed"] >= len(seen.partial)
    assert metrics["producer/samples_restarted"] == 0
