"""``train``'s ``error_rate`` is measured on production: failed groups never reach a
batch, so a batch alone would always say 0. Checked against what the environment itself
counted: every step's rate times the samples finished that step is the number of scores
that raised in it."""

from __future__ import annotations

import pytest

from loomrl.engines import ScriptedEngine
from loomrl.envs import registry
from loomrl.envs.arith import ArithEnv
from loomrl.run.train import train
from loomrl.train.config import TrainConfig


class FlakyArith(ArithEnv):
    """``arith`` whose scorer raises on the reply ``Answer: 3``; counts its calls."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls = self.raised = 0

    def score(self, state):
        self.calls += 1
        if state.assistant_messages()[-1] == "Answer: 3":
            self.raised += 1
            raise ValueError("cannot score 3")
        return super().score(state)


@pytest.fixture
def flaky_envs(monkeypatch):
    made: list[FlakyArith] = []

    def factory(**kwargs) -> FlakyArith:
        made.append(FlakyArith(**kwargs))
        return made[-1]

    monkeypatch.setitem(registry._ENVS, "flaky-arith", registry._Entry(factory, "test"))
    return made


async def test_error_rate_is_the_share_of_finished_samples_that_failed(
    tmp_path, tokenizer, flaky_envs
):
    answers = iter(range(10**6))

    def make_engine(model_dir, policy_version):
        engine = ScriptedEngine(lambda ids, p: f"Answer: {next(answers) % 7}", tokenizer=tokenizer)
        engine.set_policy_version(policy_version)
        return engine

    seen: list[tuple[int, int]] = []  # (score calls, raises) when each row is recorded

    def on_step(row):
        seen.append((sum(e.calls for e in flaky_envs), sum(e.raised for e in flaky_envs)))

    config = TrainConfig(
        model="tiny-random", env="flaky-arith", env_args={"max_operand": 5}, steps=3,
        prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=3, lr=1e-3,
    )  # fmt: skip
    rows = await train(config, tmp_path, make_engine=make_engine, on_step=on_step)

    before_calls = before_raised = before_produced = 0
    for row, (calls, raised) in zip(rows, seen, strict=True):
        finished = row["producer/samples_produced"] - before_produced
        assert finished == calls - before_calls  # every finished sample was scored once
        assert row["error_rate"] * finished == pytest.approx(raised - before_raised)
        assert row["producer/failures/error"] == raised  # cumulative
        before_calls, before_raised, before_produced = calls, raised, finished + before_produced
    assert any(row["error_rate"] > 0 for row in rows)
    assert all(row["trained_trajectories"] == 6 for row in rows)  # failed groups replaced
