"""Credit per turn: turn rewards on each turn's last model token (pieces of a cut turn are
one turn), the rest on the last token, what gae and reinforce_pp make of it against hand
computations, and the configurations where it cannot act, refused by name."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from pydantic import ValidationError

from loomrl.algos import advantages as estimators
from loomrl.cli import main
from loomrl.experience import ShapingConfig, build_experience
from loomrl.experience.turn_credit import placed_turn_rewards, turn_ends, turn_token_rewards
from loomrl.runs import write_run
from loomrl.train.config import TrainConfig
from loomrl.types import Trajectory


def episode(reward: float = 1.5, turn_rewards=(0.2, -0.2, 0.5), counted: bool = True):
    """Three turns: model tokens at 0-1 | env 2-3 | model 4 (abort) + 5-6 | env 7 | model 8-9.

    The reward is a final score of 1.0 plus the turn rewards when ``counted``."""
    mask = [1, 1, 0, 0, 1, 1, 1, 0, 1, 1]
    components = {"final": 1.0, "turns": sum(turn_rewards)} if counted else {"solved": reward}
    return Trajectory(
        example_id=0, group_id=0, sample_index=0, env="guess_number", prompt_ids=[1, 2],
        completion_ids=list(range(10, 20)), logprobs=[-0.1 * b for b in mask], loss_mask=mask,
        spans=[(0, 2), (4, 5), (5, 7), (8, 10)], span_versions=[0, 0, 1, 1],
        finish_reasons=["stop", "abort", "stop", "stop"], turns=3, reward=reward,
        reward_components=components, turn_rewards=list(turn_rewards),
    )  # fmt: skip


def test_turn_ends_join_the_pieces_of_a_cut_turn():
    assert turn_ends(episode()) == [1, 6, 9]
    fire = episode()
    fire.finish_reasons = ["stop", "fire", "length", "stop"]
    assert turn_ends(fire) == [1, 6, 9]


def test_counted_turn_rewards_land_on_their_turns_last_tokens():
    assert placed_turn_rewards(episode()) == [(1, 0.2), (6, -0.2), (9, 0.5)]
    grid = turn_token_rewards([episode(), episode(counted=False)], 12)
    assert grid[0].tolist() == [0, 0.2, 0, 0, 0, 0, -0.2, 0, 0, 0.5, 0, 0]
    assert grid[1].abs().sum() == 0  # turn_reward = "final": the reward holds no turn part


def test_a_turn_without_tokens_leaves_its_reward_on_the_last_token():
    traj = episode()
    traj.spans[3] = (10, 10)  # the last turn produced nothing
    assert placed_turn_rewards(traj) == [(1, 0.2), (6, -0.2)]


def test_more_turn_rewards_than_turns_is_refused_by_name():
    traj = episode(turn_rewards=(0.1, 0.1, 0.1, 0.1))
    with pytest.raises(ValueError, match="4 turn rewards but 3 model turns"):
        placed_turn_rewards(traj)


def gae_advantages(turn_credit: str, reward: float = 1.5) -> list[float]:
    config = ShapingConfig(
        estimator="gae", estimator_options={"gamma": 1.0, "lam": 1.0}, turn_credit=turn_credit
    )
    values = torch.zeros(1, 10)
    out = build_experience([episode(reward)], config, inputs={"values": values})
    return [round(a, 6) for a in out.advantages[0]]


def test_gae_sees_each_turns_reward_from_its_turn_on():
    # zero values, γ = λ = 1: a token's advantage is the reward still to come after it
    turn = gae_advantages("turn")
    assert turn == [1.5, 1.5, 0, 0, 1.3, 1.3, 1.3, 0, 1.5, 1.5]
    assert gae_advantages("episode") == [1.5, 1.5, 0, 0, 1.5, 1.5, 1.5, 0, 1.5, 1.5]


def test_the_token_rewards_add_up_to_the_shaped_reward():
    # an overlong penalty or clipping changes the reward: that part stays on the last token
    config = ShapingConfig(
        estimator="gae", estimator_options={"gamma": 1.0, "lam": 1.0},
        turn_credit="turn", reward_clip=(-1.0, 1.0),
    )  # fmt: skip
    out = build_experience([episode(1.5)], config, inputs={"values": torch.zeros(1, 10)})
    assert out.trajectories[0].reward == 1.0
    assert out.advantages[0][0] == pytest.approx(1.0)  # everything, from the first token
    assert out.advantages[0][4] == pytest.approx(0.8)  # after turn 1's +0.2
    assert out.metrics["turn_rewards_placed"] == 3


def test_reinforce_pp_adds_token_rewards_to_the_outcome():
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    token_rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0]])
    out = estimators.compute(
        "reinforce_pp", rewards=torch.tensor([1.0]), mask=mask, token_rewards=token_rewards
    )
    assert out.returns.tolist() == [[1.5, 1.5, 0.0, 1.0]]
    with pytest.raises(ValueError, match="token_rewards must be"):
        estimators.compute(
            "reinforce_pp", rewards=torch.tensor([1.0]), mask=mask, token_rewards=mask[:, :2]
        )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"estimator": "grpo"}, "needs an estimator that reads token rewards"),
        ({"estimator": "gae", "reward_norm": "batch"}, "use reward_norm = 'none'"),
        ({"estimator": "gae", "turn_reward": "discounted"}, "use 'sum' or 'final\\+sum'"),
    ],
)
def test_where_turn_credit_cannot_act_the_config_says_why(fields, message):
    with pytest.raises(ValidationError, match=message):
        TrainConfig(model="tiny-random", env="guess_number", turn_credit="turn", **fields)


def test_loomrl_experience_gives_turn_credit_to_reinforce_pp(tmp_path, capsys):
    write_run(tmp_path, [episode(), episode(counted=False)], {"reward_mean": 1.5}, {"env": "g"})
    argv = ["experience", str(tmp_path), "--estimator", "reinforce_pp", "--turn-credit"]
    assert main([*argv, "turn"]) == 0
    returns = pq.read_table(tmp_path / "experience.parquet").column("returns").to_pylist()
    assert [round(r, 6) for r in returns[0]] == [1.5, 1.5, 0, 0, 1.3, 1.3, 1.3, 0, 1.5, 1.5]
    assert set(returns[1]) == {0.0, 1.5}  # its reward counts no turn rewards: all at the end
    assert main([*argv, "episode"]) == 0
    returns = pq.read_table(tmp_path / "experience.parquet").column("returns").to_pylist()
    assert set(returns[0]) == {0.0, 1.5}
    assert main(["experience", str(tmp_path), "--turn-credit", "turn"]) == 2  # grpo
    assert "needs an estimator that reads token rewards" in capsys.readouterr().err
