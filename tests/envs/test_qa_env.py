"""qa: env_args, openings, each reward on right/wrong/unformatted replies, format, errors."""

from __future__ import annotations

import importlib.util
import json

import pytest

from loomrl.envs import EnvState, load, split_score
from loomrl.envs.qa import REWARDS, QAEnv
from loomrl.envs.qa.prompts import RewardName
from loomrl.envs.registry import EnvArgsError, check_args


def reply_state(env: QAEnv, example: dict, *replies: str) -> EnvState:
    """An episode of ``env`` on ``example`` whose model replied ``replies`` (no steps)."""
    state = env.reset(example)
    for text in replies:
        state.messages.append({"role": "assistant", "content": text})
        state.turn += 1
    return state


def score(env: QAEnv, reply: str, **example) -> dict[str, float]:
    return env.score(reply_state(env, {"id": 0, "question": "Q?", **example}, reply))


@pytest.fixture(scope="module")
def math_env():
    env = QAEnv("math_verify", format_weight=0.1)
    yield env
    env.checker.close()


# -- env_args -----------------------------------------------------------------------------


def test_the_reward_names_are_the_literal_the_constructor_takes():
    assert set(REWARDS) == set(RewardName.__args__)


def test_an_unknown_reward_lists_the_known_ones_before_anything_is_built():
    literal = r"reward = 'f1' is not Literal\['math_verify', 'exact', 'regex', 'choice'\]"
    with pytest.raises(EnvArgsError, match=literal):
        check_args("qa", {"reward": "f1"})
    with pytest.raises(EnvArgsError, match=literal):
        load("qa", reward="f1")
    with pytest.raises(ValueError, match="'f1'; known rewards: choice, exact, math_verify, regex"):
        QAEnv(reward="f1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be >= 1, got 0"),
        ({"max_attempts": 3, "attempt_penalty": 0.5}, r"must stay in \[0, 1\), got 0.5 \* 2"),
        ({"attempt_penalty": -0.1}, "must stay in"),
        ({"format_weight": float("nan")}, "format_weight must be finite"),
        ({"reward": "exact", "pattern": "x"}, "pattern and match are for reward='regex' only"),
        ({"reward": "choice", "match": "search"}, "for reward='regex' only"),
        ({"reward": "regex", "pattern": "("}, r"invalid regex pattern '\(': missing \)"),
        ({"reward": "regex", "pattern": ""}, "a regex pattern must be a non-empty string"),
        ({"retry_prompt": "wrong, {tries} left"}, r"retry_prompt may only use \{left\}"),
        ({"math_timeout": 0}, "timeout_s > 0"),
    ],
)
def test_bad_env_args_are_refused_by_load(kwargs, message):
    with pytest.raises(EnvArgsError, match=message):
        load("qa", **kwargs)


def test_the_math_reward_says_what_to_install_without_math_verify(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name)
    )
    with pytest.raises(ImportError, match=r"pip install 'loomrl\[math\]'"):
        load("qa")
    assert load("qa", reward="exact").reward == "exact"  # the other rewards need nothing


def test_qa_generates_no_examples():
    with pytest.raises(TypeError, match=r"needs data.*--data"):
        load("qa", reward="exact").dataset(4)


def test_only_math_verify_leaves_the_event_loop():
    assert [load("qa", reward=r).nonblocking for r in ("exact", "regex", "choice")] == [True] * 3
    assert load("qa").nonblocking is False
    assert load("qa", max_attempts=3).max_turns == 3


# -- openings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reward", "prompt"),
    [
        ("math_verify", r"Solve the problem. Put your final answer within \boxed{}."),
        (
            "exact",
            "Answer the question. End your reply with a line of the form 'Answer: <answer>'.",
        ),
        (
            "choice",
            "letter of the correct option. End your reply with a line of the form "
            "'Answer: <letter>'.",
        ),
    ],
)
def test_default_system_prompts_ask_for_the_checked_format(reward, prompt):
    state = load("qa", reward=reward).reset({"id": 0, "question": "Q?", "answer": "A"})
    assert state.messages[0]["role"] == "system" and state.messages[0]["content"].endswith(prompt)
    assert state.messages[1:] == [{"role": "user", "content": "Q?"}]


def test_system_prompt_override_and_none():
    example = {"id": 0, "question": "Q?", "answer": "x"}
    env = load("qa", reward="exact", system_prompt="Be brief.")
    assert env.reset(example).messages[0] == {"role": "system", "content": "Be brief."}
    assert load("qa", reward="exact", system_prompt="").reset(example).messages == [
        {"role": "user", "content": "Q?"}
    ]
    boxed = load("qa", reward="exact", answer_format="boxed")
    assert boxed.reset(example).messages[0]["content"].endswith(r"within \boxed{}.")


def test_messages_examples_open_with_their_own_chat():
    env = load("qa", reward="exact")
    chat = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "Answer: 4"},  # a few-shot turn
        {"role": "user", "content": "3+3?"},
    ]
    example = {"id": 5, "messages": chat, "answer": "6"}
    state = env.reset(example)
    assert state.messages[0]["role"] == "system" and state.messages[1:] == chat
    assert state.messages[1] is not chat[0]  # copies: the example is never changed
    both = env.reset({**example, "question": "ignored"}).messages
    assert both[1:] == chat  # messages win over a question ...
    null = env.reset({**example, "messages": None, "question": "Q?"}).messages
    assert null[1:] == [{"role": "user", "content": "Q?"}]  # ... unless they are null
    own_system = [{"role": "system", "content": "mine"}, *chat]
    assert env.reset({**example, "messages": own_system}).messages == own_system
    # The few-shot assistant turn is not one of the model's replies.
    assert env.score(reply_state(env, example, "Answer: 6")) == {"correct": 1.0}
    assert env.score(reply_state(env, example)) == {"correct": 0.0}


def test_choices_are_rendered_into_the_question():
    env = load("qa", reward="choice")
    state = env.reset({"id": 0, "question": "Capital?", "choices": ["Lyon", "Paris"], "answer": 1})
    assert state.messages[-1]["content"] == "Capital?\n\nA. Lyon\nB. Paris"


@pytest.mark.parametrize(
    ("reward", "example", "message"),
    [
        ("exact", {"question": "Q"}, "example 3 has no 'answer' \\(the reference the exact reward"),
        ("math_verify", {"question": "Q", "answer": None}, "example 3 has no 'answer'"),
        ("math_verify", {"question": "Q", "answer": "  "}, "example 3: its 'answer' must be a"),
        ("math_verify", {"question": "Q", "answer": float("inf")}, "must be a non-empty string"),
        ("exact", {"question": "Q", "answer": {"a": 1}}, "example 3: its 'answer' must be a str"),
        ("exact", {"question": "Q", "answer": []}, "must be a string, a number or a non-empty"),
        ("regex", {"question": "Q", "answer": "("}, r"example 3: invalid regex pattern '\('"),
        (
            "choice",
            {"question": "Q", "answer": "E", "choices": list("abcd")},
            "example 3: the reference 'E' is out of range for 4 options",
        ),
        ("choice", {"question": "Q", "answer": 7, "choices": "abc"}, "example 3: 'choices' must"),
        ("exact", {"answer": "x"}, "example 3 has neither 'question' nor 'messages'"),
        ("exact", {"messages": [], "answer": "x"}, "example 3: 'messages' must be a non-empty"),
        ("exact", {"messages": [{"content": "hi"}], "answer": "x"}, "each message needs a 'role'"),
        ("exact", {"messages": [{"role": "user"}], "answer": "x"}, "needs text 'content'"),
    ],
)
def test_a_malformed_example_is_an_error_naming_it(reward, example, message):
    env = load("qa", reward=reward)
    with pytest.raises(ValueError, match=message):
        env.reset({"id": 3, **example})


def test_regex_with_an_env_pattern_needs_no_answer_column():
    env = load("qa", reward="regex", pattern=r"\d{4}")
    assert score(env, "Answer: 1999") == {"correct": 1.0}


# -- rewards ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "answer", "correct"),
    [
        ("Answer: Paris", "paris", 1.0),
        ("Work...\nAnswer: **Paris**.", "Paris", 1.0),
        (r"It is \boxed{New   York}", "new york", 1.0),
        ('Answer: "Paris"', "Paris", 1.0),
        ("Answer: Lyon", "Paris", 0.0),
        ("Paris", "Paris", 1.0),  # no format: the whole reply is the answer
        ("I think it is Paris", "Paris", 0.0),
        ("Answer: 12", 12, 1.0),
        ("Answer: 12.0", 12, 0.0),  # text, not numbers: use math_verify for those
        ("Answer: NYC", ["New York", "NYC"], 1.0),  # a list of accepted answers
        ("", "Paris", 0.0),
    ],
)
def test_exact(reply, answer, correct):
    assert score(load("qa", reward="exact"), reply, answer=answer) == {"correct": correct}


@pytest.mark.parametrize(
    ("kwargs", "reply", "answer", "correct"),
    [
        ({}, "Answer: 2024-01-31", r"\d{4}-\d{2}-\d{2}", 1.0),
        ({}, "Answer: on 2024-01-31", r"\d{4}-\d{2}-\d{2}", 0.0),  # full: all of it
        ({}, r"\boxed{**42**}", r"4\d", 1.0),
        ({"match": "search"}, "it was on 2024-01-31, I think", r"\d{4}-\d{2}-\d{2}", 1.0),
        ({"match": "search"}, "no date", r"\d{4}", 0.0),
        ({"pattern": r"(?i)yes|no"}, "Answer: YES", "ignored", 1.0),
    ],
)
def test_regex(kwargs, reply, answer, correct):
    env = load("qa", reward="regex", **kwargs)
    assert score(env, reply, answer=answer) == {"correct": correct}


@pytest.mark.parametrize(
    ("reply", "answer", "correct"),
    [
        ("The answer is (B).", "B", 1.0),
        ("Answer: B", 1, 1.0),
        ("**B**", "Paris", 1.0),  # the reference is an option's text
        ("Answer: C", "B", 0.0),
        ("Answer: E", "E", None),  # out of range for 4 options: a bad example
        ("I am not sure", "B", 0.0),
    ],
)
def test_choice(reply, answer, correct):
    env = load("qa", reward="choice")
    options = ["Lyon", "Paris", "Rome", "Nice"]
    if correct is None:
        with pytest.raises(ValueError, match="example 0: the reference 'E' is out of range"):
            score(env, reply, answer=answer, choices=options)
    else:
        assert score(env, reply, answer=answer, choices=options) == {"correct": correct}
    assert score(env, r"\boxed{Z}", answer="Z") == {"correct": 1.0}  # no choices: A-Z


@pytest.mark.parametrize(
    ("reply", "answer", "correct"),
    [
        (r"so the answer is $\boxed{0.5}$", r"\frac{1}{2}", 1.0),
        (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{\frac12}", 0.5, 1.0),
        ("Work.\nAnswer: 1/2", "0.5", 1.0),
        ("Answer: **1/2**.", "0.5", 1.0),  # the line is unwrapped ("1/2." reads as 1)
        ("I get 42.", 42, 1.0),  # no format: math-verify reads the reply's tail
        (r"\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
        (r"\boxed{0.00001}", 1e-05, 1.0),
        (r"\boxed{1/3}", "0.5", 0.0),
        (r"\boxed{}", "0.5", 0.0),
        ("I do not know", "0.5", 0.0),
        ("", "0.5", 0.0),
    ],
)
def test_math_verify(math_env, reply, answer, correct):
    components = score(math_env, reply, answer=answer)
    assert components["correct"] == correct


def test_an_unparsable_math_reference_names_the_example(math_env):
    with pytest.raises(ValueError, match=r"example 0: math-verify cannot parse the reference"):
        score(math_env, r"\boxed{1}", answer="$$")


@pytest.mark.parametrize(
    ("kwargs", "reply", "expected"),
    [
        ({"reward": "exact"}, "Answer: Paris", {"correct": 1.0, "format": 0.2}),
        ({"reward": "exact"}, "Paris", {"correct": 1.0, "format": 0.0}),
        ({"reward": "exact"}, "Answer: Lyon", {"correct": 0.0, "format": 0.2}),
        (
            {"reward": "exact", "answer_format": "boxed"},
            r"\boxed{Paris}",
            {"correct": 1.0, "format": 0.2},
        ),
        (
            {"reward": "exact", "answer_format": "boxed"},
            "Answer: Paris",
            {"correct": 1.0, "format": 0.0},
        ),
        ({"reward": "choice"}, "Answer: B", {"correct": 1.0, "format": 0.2}),
        ({"reward": "choice"}, "The answer is B", {"correct": 1.0, "format": 0.0}),
        ({"reward": "choice"}, "Answer:", {"correct": 0.0, "format": 0.0}),  # an empty line
    ],
)
def test_format_is_a_separate_component(kwargs, reply, expected):
    env = load("qa", format_weight=0.2, **kwargs)
    answer = "B" if kwargs["reward"] == "choice" else "Paris"
    components = score(env, reply, answer=answer)
    assert components == expected
    assert split_score(components)[0] == pytest.approx(sum(expected.values()))


def test_math_format_is_a_closed_box(math_env):
    assert score(math_env, r"\boxed{1}", answer="1") == {"correct": 1.0, "format": 0.1}
    assert score(math_env, r"Answer: 1 \boxed{1", answer="1") == {"correct": 1.0, "format": 0.0}


def test_a_state_is_plain_json_data_through_a_checkpoint():
    env = load("qa", reward="exact", max_attempts=2)
    state = reply_state(env, {"id": 0, "question": "Q?", "answer": "x"}, "Answer: y")
    env.step(state, state.messages[-1])
    data = json.loads(json.dumps(env.state_dict(state)))
    assert env.score(env.load_state_dict(data)) == env.score(state)
