"""``examples/guess-number-ppo.toml``: PPO with a critic and credit per turn runs 3 steps
with the scripted engine and the tiny model; each step places the guesses' rewards on
their turns, and the episode-credit arm of the same run places none."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomrl.engines import ScriptedEngine
from loomrl.run.train import train
from loomrl.train.config import TrainConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "guess-number-ppo.toml"
SMALL = dict(
    model="tiny-random", steps=3, prompts_per_step=2, n=3, max_tokens=8, max_turns=3,
    max_len=256, checkpoint_every=3, mini_batch_size=3, engine_args={},
)  # fmt: skip


@pytest.fixture
def engines(tokenizer):
    """Guesses 1, 2, 3, ... in turn, sometimes a reply without an integer."""
    replies = iter(range(10**6))

    def make(model_dir, policy_version):
        def reply(prompt_ids, params):
            i = next(replies)
            return "no idea" if i % 5 == 4 else str(1 + i % 10)

        engine = ScriptedEngine(reply, tokenizer=tokenizer)
        engine.set_policy_version(policy_version)
        return engine

    return make


@pytest.mark.parametrize("credit", ["turn", "episode"])
async def test_the_example_trains_with_turn_rewards_on_their_turns(tmp_path, engines, credit):
    config = TrainConfig.load(EXAMPLE, SMALL | {"turn_credit": credit})
    assert config.critic and config.estimator == "gae"
    rows = await train(config, tmp_path, make_engine=engines)
    assert [r["step"] for r in rows] == [1, 2, 3]
    placed = [r.get("turn_rewards_placed", 0) for r in rows]
    # 6 games of up to 3 guesses a step, each guess rewarded ±0.1
    assert all(6 <= p <= 18 for p in placed) if credit == "turn" else placed == [0, 0, 0]
    assert all("explained_variance" in r and r["value_loss"] > 0 for r in rows)
