"""``RewardConfig`` forms, ``build_reward`` and ``check_reward``'s one-line refusals."""

from __future__ import annotations

import tomllib

import pytest
import tomli_w
from pydantic import ValidationError

from loomrl.config import RolloutConfig
from loomrl.engines import ScriptedEngine
from loomrl.models import resolve
from loomrl.rewards import RewardSample
from loomrl.rewards.build import build_reward, check_reward
from loomrl.rewards.config import RewardConfig
from loomrl.runs import toml_ready


def sample(completion: str, **example) -> RewardSample:
    return RewardSample(prompt="What is 2+3?", completion=completion, example=example)


def test_a_name_alone_is_a_one_function_rubric():
    config = RewardConfig.model_validate("math_verify")
    assert [(t.fn, t.weight, t.args) for t in config.rubric] == [("math_verify", 1.0, {})]
    assert config.model is None and config.remote is None and config.judge is None


def test_a_table_form_from_toml():
    text = """
[rollout]
env = "arith"

[rollout.reward]
rubric = [
  { fn = "exact", weight = 1.0 },
  { fn = "format", weight = 0.1, answer_format = "number" },
  { fn = "num_chars", weight = 0.0, name = "chars" },
]
model = "tiny-reward"
remote = "http://127.0.0.1:1/score"
judge = { engine = "tiny-random", prompt = "Q: {question}\\nA: {answer}", weight = 0.5 }
"""
    config = RolloutConfig.model_validate(tomllib.loads(text)["rollout"]).reward
    assert config is not None
    assert [(t.component, t.weight, t.args) for t in config.rubric] == [
        ("exact", 1.0, {}), ("format", 0.1, {"answer_format": "number"}), ("chars", 0.0, {}),
    ]  # fmt: skip
    assert config.model.path == "tiny-reward" and config.model.weight == 1.0
    assert config.remote.url == "http://127.0.0.1:1/score"
    assert config.judge.engine == "tiny-random" and config.judge.weight == 0.5
    assert config.summary() == "exact=1, format=0.1, chars=0, model=1, remote=1, judge=0.5"


def test_the_config_round_trips_through_config_toml_with_urls_redacted():
    config = RolloutConfig(
        env="arith",
        reward={
            "rubric": [{"fn": "regex", "pattern": "[0-9]+", "match": "search"}],
            "remote": {"url": "https://rm.example/score?key=SECRET", "token_env": "RM_TOKEN"},
        },
    )
    written = tomli_w.dumps(toml_ready(config.model_dump(mode="json")))
    assert "SECRET" not in written and "RM_TOKEN" in written
    again = RolloutConfig.model_validate(tomllib.loads(written))
    assert again.reward.rubric == config.reward.rubric
    assert again.reward.rubric[0].args == {"pattern": "[0-9]+", "match": "search"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({}, "a reward needs a rubric, a model, a remote server or a judge"),
        ({"rubric": [{"fn": "exact"}, {"fn": "exact"}]}, "given twice"),
        ({"rubric": [{"fn": "exact", "weight": float("nan")}]}, "finite number"),
        ({"models": "tiny-reward"}, "Extra inputs are not permitted"),
        ({"judge": {"prompt": "{answer}"}}, "engine"),
    ],
)
def test_malformed_tables_are_refused(value, message):
    with pytest.raises(ValidationError, match=message):
        RewardConfig.model_validate(value)


async def test_build_reward_weights_named_functions_into_one_recipe():
    config = RewardConfig.model_validate(
        {"rubric": [
            {"fn": "exact", "weight": 1.0},
            {"fn": "format", "weight": 0.25, "answer_format": "number"},
            {"fn": "num_chars", "weight": 0.0, "name": "chars"},
        ]}
    )  # fmt: skip
    built = build_reward(config)
    good, bad = await built.scorer.score_many(
        [sample("Answer: 5", answer=5), sample("6", answer=5)]
    )
    assert good.components == {"exact": 1.0, "format": 0.25} and good.metrics == {"chars": 9.0}
    assert bad.components == {"exact": 0.0, "format": 0.0} and bad.total == 0.0
    await built.close()


async def test_build_reward_with_the_tiny_reward_model():
    config = RewardConfig.model_validate(
        {"rubric": [{"fn": "exact"}], "model": {"path": "tiny-reward", "weight": 0.5}}
    )
    scorer = build_reward(config).scorer
    a, b = await scorer.score_many([sample("Answer: 5", answer=5), sample("no idea", answer=5)])
    assert set(a.components) == {"exact", "model"} and a.weights["model"] == 0.5
    assert a.values["model"] != b.values["model"]  # a real forward pass, input-dependent
    (again,) = await build_reward(config).scorer.score_many([sample("Answer: 5", answer=5)])
    assert again.values == a.values  # deterministic: tiny-reward is a function of its seed


async def test_build_reward_with_a_remote_server(reward_server):
    config = RewardConfig.model_validate({"remote": {"url": reward_server.url, "weight": 2.0}})
    (score,) = await build_reward(config).scorer.score_many([sample("abcd")])
    assert score.components == {"remote": 8.0}  # the server scores len(completion)


async def test_build_reward_with_a_judge_closes_its_engine(tokenizer):
    engines = []

    def judge_engine(judge):
        engines.append(ScriptedEngine(lambda ids, p: "fine.\nScore: 8", tokenizer=tokenizer))
        return engines[-1]

    config = RewardConfig.model_validate(
        {"judge": {"engine": "tiny-random", "prompt": "Q: {question}\nA: {answer}\nScore 0-10."}}
    )
    built = build_reward(config, judge_engine=judge_engine)
    (score,) = await built.scorer.score_many([sample("5")])
    assert score.components == {"judge": pytest.approx(0.8)}
    assert built.engines == engines
    await built.close()
    assert built.engines == [] and engines[0]._closed


# -- check_reward: one line each, before any engine starts -----------------------------------


def check(value) -> str:
    with pytest.raises(ValueError) as info:
        check_reward(RewardConfig.model_validate(value))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_an_unknown_function_name_gets_a_close_match():
    assert check("exactt").startswith(
        "reward.rubric[0]: unknown reward function 'exactt' (did you mean 'exact'?); known: "
        "choice, exact, format, length_penalty, math_verify, num_chars, regex"
    )


def test_a_function_argument_it_does_not_take():
    assert check({"rubric": [{"fn": "exact", "keys": "x"}]}) == (
        "reward.rubric[0]: reward function 'exact' takes key; got keys"
    )
    assert check({"rubric": [{"fn": "regex", "pattern": "("}]}).startswith(
        "reward.rubric[0]: regex: invalid regex pattern '('"
    )


def test_a_missing_reward_model_directory(tmp_path):
    assert check({"model": str(tmp_path / "none")}) == (
        f"reward.model: {str(tmp_path / 'none')!r} is neither a model spec "
        "(smollm2-135m-instruct, tiny-random, smolvlm-tiny, tiny-reward) nor a local "
        "directory (reward models are never downloaded)"
    )


def test_a_model_that_is_not_a_sequence_classifier():
    message = check({"model": str(resolve("tiny-random"))})
    assert "is not a sequence-classification model (architectures: ['LlamaForCausalLM'])" in (
        message
    )


def test_a_reward_model_directory_passes(classifier_dir):
    check_reward(RewardConfig.model_validate({"model": str(classifier_dir)}))
    check_reward(RewardConfig.model_validate({"model": "tiny-reward"}))


def test_an_unreachable_remote_url(dead_url):
    assert check({"remote": dead_url}).startswith(
        f"reward.remote: cannot reach {dead_url} (Connection refused; waited up to 3s)"
    )


def test_a_remote_url_with_credentials_or_an_unset_token(monkeypatch):
    assert "has credentials in it" in check({"remote": "https://u:p@rm.example/score"})
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    assert "environment variable NO_SUCH_TOKEN is not set" in check(
        {"remote": {"url": "https://rm.example/score", "token_env": "NO_SUCH_TOKEN"}}
    )


def test_a_reachable_remote_url_passes(reward_server):
    check_reward(RewardConfig.model_validate({"remote": reward_server.url}))


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("Rate: {question}", "reward.judge.prompt: judge template never shows the {answer}"),
        ("{answer} {reply}", "reward.judge.prompt: judge template uses unknown field(s) ['reply']"),
        ("{answer} {", "reward.judge.prompt: invalid judge template"),
    ],
)
def test_a_judge_prompt_without_the_placeholders_it_needs(prompt, message):
    assert check({"judge": {"engine": "tiny-random", "prompt": prompt}}).startswith(message)


def test_a_judge_engine_that_is_no_model_or_no_server(dead_url):
    assert check({"judge": {"engine": "no-such-model"}}).startswith(
        "reward.judge.engine: unknown model 'no-such-model'"
    )
    assert check({"judge": {"engine": dead_url}}).startswith(
        f"reward.judge.engine: cannot reach {dead_url}"
    )
