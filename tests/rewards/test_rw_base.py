"""The shared records: RewardSample, RewardScore, per_sample and the score checks."""

from __future__ import annotations

import math

import pytest

from loomrl.envs import split_score
from loomrl.rewards import RewardError, RewardSample, RewardScore, RewardSource, per_sample
from loomrl.rewards.base import check_scores


def test_conversation_of_a_bare_sample_is_user_then_assistant():
    sample = RewardSample(prompt="2+2?", completion="4")
    assert sample.conversation() == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert sample.label == "default" and dict(sample.example) == {}


def test_reward_score_components_sum_to_total_and_metrics_stay_apart():
    score = RewardScore(
        values={"correct": 1.0, "format": 1.0, "chars": 42.0},
        weights={"correct": 1.0, "format": 0.1, "chars": 0.0},
    )
    assert score.components == {"correct": 1.0, "format": 0.1}
    assert score.metrics == {"chars": 42.0}
    assert score.total == pytest.approx(1.1)
    assert split_score(score.components) == (score.total, score.components)


async def test_per_sample_runs_sync_and_async_functions_as_a_source():
    async def shout(sample):
        return sample.completion.isupper()

    samples = [RewardSample("q", "YES"), RewardSample("q", "no")]
    assert await per_sample(shout)(samples) == [1.0, 0.0]
    assert await per_sample(lambda s: len(s.completion))(samples) == [3.0, 2.0]
    assert isinstance(per_sample(shout), RewardSource)


async def test_per_sample_names_the_function_and_sample_that_failed():
    def picky(sample):
        if sample.completion == "bad":
            raise KeyError("nope")
        return 1.0

    source = per_sample(picky)
    with pytest.raises(RewardError, match=r"reward function 'picky' on sample 1 raised KeyError"):
        await source([RewardSample("q", "ok"), RewardSample("q", "bad")])
    with pytest.raises(RewardError, match=r"'nan_fn' on sample 0 returned nan, expected a finite"):
        await per_sample(lambda s: math.nan, "nan_fn")([RewardSample("q", "x")])
    with pytest.raises(RewardError, match=r"returned str 'high', expected a float"):
        await per_sample(lambda s: "high", "words")([RewardSample("q", "x")])
    with pytest.raises(TypeError, match="per_sample needs a callable, got int"):
        per_sample(3)


def test_check_scores_rejects_wrong_shapes_with_the_source_name():
    assert check_scores([1, 2.5, True], 3, "src") == [1.0, 2.5, 1.0]
    with pytest.raises(RewardError, match="src returned 2 scores for 3 samples"):
        check_scores([1.0, 2.0], 3, "src")
    with pytest.raises(RewardError, match=r"src returned float, expected a list of 1 scores"):
        check_scores(1.0, 1, "src")
    with pytest.raises(RewardError, match=r"src for sample 1 returned inf"):
        check_scores([0.0, math.inf], 2, "src")
