"""A text-only token layer refuses content that is not text (an image part, a list of
parts, an object): a template would render it as its Python repr and the model would be
trained on that text. The episode ends as an error that says so; nothing is generated."""

from __future__ import annotations

import pytest

import loomrl
from loomrl.envs.base import Environment, EnvState, EnvStep
from loomrl.tokens import TemplateError
from loomrl.types import Status

IMAGE_PART = {"type": "image", "image": object()}


class Pictures(Environment):
    name = "pictures"
    max_turns = 2

    def __init__(self, where: str) -> None:
        self.where = where

    def reset(self, example):
        if self.where == "prompt":
            content = [IMAGE_PART, {"type": "text", "text": "How many?"}]
            return EnvState(messages=[{"role": "user", "content": content}], example=example)
        return EnvState(messages=[{"role": "user", "content": "Look next."}], example=example)

    def step(self, state, message):
        return EnvStep(messages=[{"role": "user", "content": [IMAGE_PART]}], done=False)

    def score(self, state):
        return 0.0


@pytest.mark.parametrize(("where", "turns"), [("prompt", 0), ("reply", 1)])
async def test_image_content_for_a_text_model_is_a_clear_error(make_engine, where, turns):
    engine = make_engine(["A guess."])
    [traj] = await loomrl.rollout(engine, Pictures(where), [{"id": 0}], on_error="isolate")
    assert traj.status == Status.ERROR and traj.turns == turns
    assert "message 1 (user) has image" in traj.error and "content, not text" in traj.error
    assert "vision-language model" in traj.error


def test_the_chat_tokenizer_names_the_message_and_its_parts(chat):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": {"a": 1}}]
    with pytest.raises(TemplateError, match=r"message 2 \(user\) has dict content"):
        chat.prompt_ids(messages)
