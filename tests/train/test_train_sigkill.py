"""``loomrl train`` killed with SIGKILL (not an exception) and resumed: a child process
trains with async production, is killed between checkpoints, and the resumed run ends
with every step recorded exactly once and no group trained twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from train_child import child_script, resume_scripted, rows_logged, step_rows

from loomrl.train.checkpoint import latest_checkpoint

STEPS = 10
CONFIG = dict(
    model="tiny-random", env="arith", env_args={"max_operand": 5}, steps=STEPS,
    prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=2, lr=1e-3,
    producer="async", max_staleness=1,
)  # fmt: skip


async def test_a_sigkilled_training_run_resumes_exactly(tmp_path, tokenizer):
    script = tmp_path / "child.py"
    script.write_text(child_script(CONFIG, 'f"Answer: {i % 7}"'))
    out = tmp_path / "run"
    child = subprocess.Popen([sys.executable, str(script), str(out)], start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while rows_logged(out) < 3:
            assert child.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no third step within 180 s"
            time.sleep(0.01)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    killed_at = rows_logged(out)
    assert killed_at < STEPS
    checkpoint = latest_checkpoint(out).step
    assert checkpoint >= 2

    rows = await resume_scripted(CONFIG, out, tokenizer, "Answer: 3")
    consumed = []
    for step in range(1, STEPS + 1):
        table = step_rows(out, step)
        assert len(table) == 6
        for r in table:  # trained with the weights of version step-1, at most 1 stale
            assert step - 2 <= min(r["span_versions"]) <= max(r["span_versions"]) <= step - 1
        consumed += [r["group_id"] for r in table]
    assert len(set(consumed)) * 3 == len(consumed), "a group was trained on twice"
    assert latest_checkpoint(out).step == STEPS
    # Consumption by the lost steps after the checkpoint was taken back by the rewind.
    assert rows[-1]["producer/groups_consumed"] == STEPS * 2
