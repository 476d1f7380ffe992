"""``reasoning_gym:TASK`` on the real reasoning-gym package: names, env_args refused before
anything is built, deterministic examples that survive JSON, scoring by the task's own
scorer (bounded, never raising on model text), composite mixes, and real rollouts."""

from __future__ import annotations

import asyncio
import enum
import json
import math
import sys
from fractions import Fraction

import numpy as np
import pytest
import reasoning_gym
from hypothesis import given, settings
from hypothesis import strategies as st
from reasoning_gym.utils import extract_answer

import loomrl
from loomrl.envs import EnvState, load
from loomrl.envs.adapters import reasoning_gym as adapter
from loomrl.envs.base import check_plain
from loomrl.envs.registry import EnvArgsError, check_args, family_members
from loomrl.types import Status

# Each scores its reference 1.0 and "junk" 0.0; rearc's scorer compares tuples (its entry
# must be regenerated), prime_factorization's raises on "junk".
TASKS = ["basic_arithmetic", "leg_counting", "chain_sum", "letter_counting", "rearc",
         "prime_factorization"]  # fmt: skip
MIX = {"basic_arithmetic": 1.0, "leg_counting": {"weight": 2, "max_animals": 4}}


def reply(answer: object) -> str:
    return f"Let me think.\n<answer>{answer}</answer>"


def scored(env, example, text: str) -> dict[str, float]:
    state = EnvState(messages=[{"role": "assistant", "content": text}], example=example)
    return env.score(state)


@pytest.fixture(scope="module")
def arith():
    return load("reasoning_gym:basic_arithmetic", max_terms=3, max_digits=2, format_weight=0.5)


# -- names -----------------------------------------------------------------------------------


def test_the_family_lists_every_reasoning_gym_task():
    names = family_members("reasoning_gym")
    assert names == sorted(reasoning_gym.factory.DATASETS)
    assert {"basic_arithmetic", "leg_counting", "composite"} <= set(names)


def test_an_unknown_task_names_close_matches_and_how_to_list_all():
    count = len(reasoning_gym.factory.DATASETS)
    with pytest.raises(ValueError) as info:
        check_args("reasoning_gym:basic_arithmatic", {})
    assert str(info.value) == (
        "unknown reasoning_gym task 'basic_arithmatic'; did you mean basic_arithmetic, "
        "bitwise_arithmetic, decimal_arithmetic, complex_arithmetic? "
        f"`loomrl envs reasoning_gym` lists all {count}"
    )
    with pytest.raises(ValueError, match=r"^unknown reasoning_gym task 'zzqx'; `loomrl envs"):
        load("reasoning_gym:zzqx")


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import raises ImportError
    with pytest.raises(adapter.MissingExtra, match=r"pip install 'loomrl\[envs\]'") as info:
        check_args("reasoning_gym:leg_counting", {})
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


# -- env_args --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_args, message",
    [
        ({"min_digit": 1}, "basic_arithmetic has no argument 'min_digit' (did you mean "
         "'min_digits'?); it takes min_terms, max_terms, min_digits, max_digits, operators, "),
        ({"min_digits": "3"}, "basic_arithmetic: min_digits = \"3\" is not int (Input should "
         "be a valid integer)"),
        ({"allow_negation": 1}, "basic_arithmetic: allow_negation = 1 is not bool"),
        ({"min_digits": 0}, "basic_arithmetic: min_digits must be positive (given: "
         "min_digits = 0)"),
        ({"min_terms": 5, "max_terms": 3}, "basic_arithmetic: max_terms must be >= min_terms "
         "(given: min_terms = 5, max_terms = 3)"),
        ({"size": 0}, "basic_arithmetic: size must be >= 1, got 0"),
        ({"format_style": "fancy"}, "basic_arithmetic: format_style = \"fancy\" is not "
         "Literal['simple', 'natural']"),
        ({"system_prompt": "defualt"}, "system_prompt 'defualt' is neither a reasoning-gym "
         "prompt name (DeepSeekZero, default, simple, direct, chain_of_draft) nor a prompt"),
        ({"tasks": {"leg_counting": 1}}, "tasks mixes several tasks: use "
         "reasoning_gym:composite, not reasoning_gym:basic_arithmetic"),
        ({"format_weight": math.inf}, "format_weight must be finite, got inf"),
        ({"few_shot": -1}, "few_shot must be >= 0, got -1"),
    ],
)  # fmt: skip
def test_bad_config_is_one_line_naming_the_task_and_argument(env_args, message):
    with pytest.raises(EnvArgsError) as info:
        load("reasoning_gym:basic_arithmetic", **env_args)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(
        f"environment 'reasoning_gym:basic_arithmetic' refused its env_args: {message}"
    ), text


def test_own_arguments_are_type_checked_from_the_signature():
    with pytest.raises(EnvArgsError, match=r"format_weight = 'high' is not float"):
        check_args("reasoning_gym:leg_counting", {"format_weight": "high"})
    check_args("reasoning_gym:leg_counting", {"format_weight": 1, "max_animals": 4})


def test_json_lists_are_fine_tuples_and_config_fields_reach_the_dataset():
    env = load(
        "reasoning_gym:basic_arithmetic",
        operators=["+"], allow_negation=False, min_digits=2, max_digits=2,
    )  # fmt: skip
    questions = [e["question"] for e in env.dataset(6, seed=2)]
    assert not any(set(q) & set("*/") for q in questions), questions  # "-": negative numbers
    assert all(e["metadata"]["num_digits"] == 2 for e in env.dataset(6, seed=2))


# -- examples --------------------------------------------------------------------------------


def test_examples_are_the_library_entries_in_order(arith):
    data = arith.dataset(5, seed=7)
    library = reasoning_gym.create_dataset("basic_arithmetic", max_terms=3, max_digits=2, seed=7)
    assert [e["id"] for e in data] == list(range(5))
    assert [(e["question"], e["answer"]) for e in data] == [
        (library[i]["question"], library[i]["answer"]) for i in range(5)
    ]
    assert all(e["task"] == "basic_arithmetic" and e["entry"] == {"seed": 7, "index": i}
               for i, e in enumerate(data))  # fmt: skip


def test_examples_are_deterministic_and_prefix_stable(arith):
    data = arith.dataset(6, seed=3)
    again = load("reasoning_gym:basic_arithmetic", max_terms=3, max_digits=2).dataset(6, seed=3)
    assert [e["question"] for e in data] == [e["question"] for e in again]
    assert arith.dataset(4, seed=3) == data[:4]
    assert arith.dataset(6, seed=4) != data


def test_past_size_examples_come_from_a_fresh_seed_and_env_seed_wins():
    env = load("reasoning_gym:leg_counting", size=3, seed=9)
    data = env.dataset(7, seed=0)  # env_args seed=9 overrides the run's seed
    assert [e["entry"]["index"] for e in data] == [0, 1, 2, 0, 1, 2, 0]
    seeds = [e["entry"]["seed"] for e in data]
    assert seeds[:3] == [9, 9, 9] and len({seeds[0], seeds[3], seeds[6]}) == 3
    assert len({e["question"] for e in data}) == 7
    assert data == env.dataset(7, seed=123)


@pytest.mark.parametrize("task", [*TASKS, "composite"])
def test_examples_are_plain_json(task):
    env = load(f"reasoning_gym:{task}", **({"tasks": MIX} if task == "composite" else {}))
    data = env.dataset(3, seed=1)
    check_plain(data)  # tuples in metadata (e.g. difficulty ranges) became lists
    assert json.loads(json.dumps(data)) == data


def test_metadata_values_become_plain_json():
    class Colour(str, enum.Enum):  # noqa: UP042 (reasoning-gym's own StrEnum is this)
        RED = "red"

    value = {1: (Fraction(1, 3), {2, 1}), "x": [np.int64(4), np.float64(0.5), math.nan],
             "a": np.array([[1, 2]]), "c": Colour.RED, "b": True}  # fmt: skip
    assert adapter.plain(value) == {
        "1": ["1/3", [1, 2]], "x": [4, 0.5, "nan"], "a": [[1, 2]], "c": "red", "b": True,
    }  # fmt: skip
    check_plain(adapter.plain(value))


# -- scoring ---------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_the_reference_scores_one_and_junk_zero_after_a_json_round_trip(task):
    env = load(f"reasoning_gym:{task}")
    for example in json.loads(json.dumps(env.dataset(3, seed=5))):
        assert scored(env, example, reply(example["answer"])) == {"correct": 1.0}, example
        assert scored(env, example, reply("junk")) == {"correct": 0.0}
        assert scored(env, example, "no tags at all") == {"correct": 0.0}


@pytest.mark.parametrize("task", ["rearc", "composite"])
async def test_a_state_checkpointed_as_json_scores_the_same_when_loaded(task):
    env = load(f"reasoning_gym:{task}", **({"tasks": MIX} if task == "composite" else {}))
    for example in env.dataset(2, seed=8):
        state = await env.reset(example)
        state.messages.append({"role": "assistant", "content": reply(example["answer"])})
        saved = json.loads(json.dumps(env.state_dict(state)))  # the replay buffer's log
        fresh = load(f"reasoning_gym:{task}", **({"tasks": MIX} if task == "composite" else {}))
        assert fresh.score(fresh.load_state_dict(saved)) == {"correct": 1.0}


def test_format_weight_pays_for_an_answer_block(arith):
    (example,) = arith.dataset(1, seed=0)
    assert scored(arith, example, reply(example["answer"])) == {"correct": 1.0, "format": 0.5}
    assert scored(arith, example, reply("nope")) == {"correct": 0.0, "format": 0.5}
    assert scored(arith, example, f"it is {example['answer']}") == {"correct": 0.0, "format": 0.0}


def test_the_last_answer_block_counts(arith):
    (example,) = arith.dataset(1, seed=0)
    text = f"<answer>wrong</answer> on second thought <answer>{example['answer']}</answer>"
    assert scored(arith, example, text)["correct"] == 1.0


def test_an_example_whose_entry_regenerates_differently_scores_from_its_own_answer(arith):
    (example,) = arith.dataset(1, seed=0)
    moved = {**example, "entry": {"seed": 999, "index": 0}}  # another process, another entry
    assert scored(arith, moved, reply(example["answer"]))["correct"] == 1.0
    from_file = {k: v for k, v in example.items() if k != "entry"}
    assert scored(arith, from_file, reply(example["answer"]))["correct"] == 1.0
    with pytest.raises(ValueError, match=r"example 0 has no 'answer' to score against"):
        scored(arith, {"id": 0, "question": "?"}, reply(1))


def test_an_example_of_another_task_is_refused(arith):
    (example,) = arith.dataset(1, seed=0)
    with pytest.raises(ValueError, match=r"example 0 is of task 'leg_counting', which this "):
        scored(arith, {**example, "task": "leg_counting"}, reply(1))


def test_scorer_results_are_clipped_and_oversized_answers_never_reach_it(monkeypatch):
    env = load("reasoning_gym:leg_counting")
    (example,) = env.dataset(1, seed=0)
    seen = []

    def scorer(answer, entry):
        seen.append(answer)
        return {"7": 7.0, "nan": math.nan, "-1": -1.0}[answer]

    monkeypatch.setitem(env._scorers, "leg_counting", scorer)
    assert [scored(env, example, reply(a))["correct"] for a in ("7", "nan", "-1")] == [1, 0, 0]
    too_long = "1" * (adapter.MAX_ANSWER_CHARS + 1)
    assert scored(env, example, reply(too_long))["correct"] == 0.0
    assert seen == ["7", "nan", "-1"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["<answer>", "</answer>", "<answer", "answer>", " ", "\n", "7",
                                 "x", "</"]), max_size=30).map("".join))  # fmt: skip
def test_answer_extraction_agrees_with_the_library(text):
    assert adapter.answer_of(text) == extract_answer(text)


def test_answer_extraction_is_linear_in_unclosed_tags():
    # The library's regex alone rescans the text once per unclosed tag: ~10^10 steps here.
    text = "<answer>" * 50_000 + "x</answer>" + "<answer>" * 50_000
    assert adapter.answer_of(text) == "<answer>" * 49_999 + "x"


@pytest.fixture(scope="module")
def scoring_cases():
    envs = [load(f"reasoning_gym:{t}", format_weight=1.0) for t in TASKS]
    return [(env, env.dataset(1, seed=0)[0]) for env in envs]


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=200))
def test_scoring_never_raises_on_model_text(scoring_cases, text):
    for env, example in scoring_cases:
        for content in (text, f"<answer>{text}</answer>"):
            result = scored(env, example, content)
            assert set(result) <= {"correct", "format"}
            assert all(0.0 <= v <= 1.0 for v in result.values())


# -- composite -------------------------------------------------------------------------------


def test_a_composite_keeps_each_examples_task_and_scores_it_with_that_task():
    env = load("reasoning_gym:composite", tasks=MIX, size=50, seed=4)
    data = json.loads(json.dumps(env.dataset(12)))
    assert {e["task"] for e in data} == {"basic_arithmetic", "leg_counting"}
    for example in data:
        assert example["metadata"]["source_dataset"] == example["task"]
        assert scored(env, example, reply(example["answer"])) == {"correct": 1.0}
        assert scored(env, example, reply("junk")) == {"correct": 0.0}
    legs = [e for e in data if e["task"] == "leg_counting"]
    assert all(e["metadata"]["num_animals"] <= 4 for e in legs)  # its own config applies


@pytest.mark.parametrize(
    "env_args, message",
    [
        ({}, "reasoning_gym:composite needs env_args tasks = {NAME = WEIGHT, ...}"),
        ({"tasks": {"leg_countin": 1}}, "tasks: unknown reasoning_gym task 'leg_countin'; "
         "did you mean leg_counting"),
        ({"tasks": {"leg_counting": 0}}, "tasks.leg_counting: weight must be a number > 0, "
         "got 0"),
        ({"tasks": {"leg_counting": {"seed": 1}}}, "tasks.leg_counting: set seed for the "
         "whole mix (env_args seed)"),
        ({"tasks": {"leg_counting": {"max_animals": 0}}}, "tasks.leg_counting: max_animals "
         "must be >= min_animals (given: max_animals = 0)"),
        ({"tasks": {"leg_counting": {"legs": 4}}}, "tasks.leg_counting has no argument "
         "'legs'"),
        ({"tasks": {"leg_counting": 1}, "datasets": []}, "composite has no argument "
         "'datasets'; it takes size, seed; and tasks, format_weight, system_prompt, few_shot"),
    ],
)  # fmt: skip
def test_bad_mixes_are_one_line_naming_the_task(env_args, message):
    with pytest.raises(EnvArgsError) as info:
        load("reasoning_gym:composite", **env_args)
    assert str(info.value).startswith(
        f"environment 'reasoning_gym:composite' refused its env_args: {message}"
    ), str(info.value)


# -- rollouts --------------------------------------------------------------------------------


@pytest.mark.parametrize("name, env_args", [("basic_arithmetic", {"format_weight": 0.5}),
                                            ("leg_counting", {"few_shot": 2}),
                                            ("composite", {"tasks": MIX})])  # fmt: skip
async def test_a_rollout_answering_the_reference_earns_full_reward(
    make_engine, tokenizer, check_contract, name, env_args
):
    env = load(f"reasoning_gym:{name}", **env_args)
    examples = env.dataset(4, seed=2)
    answers = {e["question"]: e["answer"] for e in examples}

    def answer(ids, params):
        asked = tokenizer.decode(list(ids)).rsplit("<|im_start|>user\n", 1)[1]  # not a shot's
        (question,) = [q for q in answers if q in asked]
        return reply(answers[question])

    results = await loomrl.rollout(
        make_engine(answer), env, examples, n=2, env_timeout=30, on_error="isolate"
    )
    assert [t.status for t in results] == [Status.TERMINATED] * 8, [t.error for t in results]
    full = 1.0 + env_args.get("format_weight", 0.0)
    assert [t.reward for t in results] == [full] * 8
    for traj in results:
        check_contract(traj)
        assert traj.messages[0] == {"role": "system", "content": env.system_prompt}
        assert len(traj.messages) == 3 + 2 * env_args.get("few_shot", 0)


def test_few_shot_opens_every_example_with_the_same_solved_entries():
    env = load("reasoning_gym:leg_counting", few_shot=2)
    data = env.dataset(3, seed=1)
    shots = data[0]["shots"]
    assert len(shots) == 2 and all(e["shots"] == shots for e in data)
    assert {s["question"] for s in shots}.isdisjoint(e["question"] for e in data)
    assert env.dataset(3, seed=2)[0]["shots"] != shots
    state = asyncio.run(env.reset(data[0]))
    roles = ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["role"] for m in state.messages] == roles
    assert state.messages[2]["content"] == f"<answer>{shots[0]['answer']}</answer>"
    assert state.messages[-1]["content"] == data[0]["question"]
    assert "shots" not in load("reasoning_gym:leg_counting").dataset(1)[0]


def test_few_shot_needs_entries_with_a_reference_answer():
    env = load("reasoning_gym:graph_color", few_shot=1)  # many answers fit: none is given
    with pytest.raises(ValueError, match=r"found 0 entries with a reference answer for few_"):
        env.dataset(1)
