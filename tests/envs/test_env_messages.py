"""The default ``reset`` opens an episode with an example's ``messages`` (the env's
``system_prompt`` first unless they bring their own); ``question`` examples are as before."""

from __future__ import annotations

import pytest

from loomrl.envs import load
from loomrl.envs.base import Environment, EnvState


class Plain(Environment):
    name = "plain"

    def score(self, state: EnvState) -> float:
        return 0.0


def test_messages_open_the_episode_after_the_system_prompt():
    env = load("arith")
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    state = env.reset({"id": 0, "messages": chat, "answer": 4})
    assert state.messages == [{"role": "system", "content": env.system_prompt}, *chat]
    state.messages.append({"role": "assistant", "content": "4"})
    assert chat == [{"role": "user", "content": "What is 2 + 2?"}]  # the example is untouched


def test_own_system_message_replaces_the_env_prompt():
    chat = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "hi"}]
    assert load("arith").reset({"id": 0, "messages": chat}).messages == chat


def test_messages_win_over_a_question_and_null_messages_do_not_count():
    chat = [{"role": "user", "content": "from messages"}]
    state = Plain().reset({"id": 0, "question": "from question", "messages": chat})
    assert state.messages == chat
    state = Plain().reset({"id": 0, "question": "from question", "messages": None})
    assert state.messages == [{"role": "user", "content": "from question"}]


def test_the_question_path_is_unchanged():
    env = load("arith")
    state = env.reset({"id": 3, "question": "What is 1 + 1?", "answer": 2})
    assert state.messages == [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": "What is 1 + 1?"},
    ]


@pytest.mark.parametrize(
    "messages, message",
    [
        ([], "plain: example 5: messages: an empty list of messages"),
        ([{"role": "robot", "content": "x"}], "plain: example 5: messages: message 1 has role"),
        ("hi", "plain: example 5: messages: expected a list of messages, got str"),
    ],
)
def test_bad_messages_are_named(messages, message):
    with pytest.raises(ValueError, match=message):
        Plain().reset({"id": 5, "messages": messages})


def test_neither_question_nor_messages():
    with pytest.raises(ValueError, match="plain: example 1 has no 'question' or 'messages'"):
        Plain().reset({"id": 1, "text": "x"})
