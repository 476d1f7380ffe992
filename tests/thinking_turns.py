"""Qwen3's thinking turns for the thinking-model tests (docs/thinking.md): the turns a
Qwen3 model writes in a calculator episode, reasoning first; the calculator whose user
asks on (the point where Qwen3's template drops earlier turns' reasoning); and the check
that every reasoning block is the model's and trained on."""

from __future__ import annotations

from pathlib import Path

from loomrl import parsers
from loomrl.envs.base import EnvState, EnvStep
from loomrl.envs.calculator import CalculatorEnv
from loomrl.experience import pad
from loomrl.types import Trajectory

TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
QWEN = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>"]
QWEN += ["</think>"]
EOT = "<|im_end|>"
EXAMPLE = {"id": 0, "question": "What is 12 * 3 + 4?", "answer": 40}
FOLLOW_UP = "Now add 4 to it."
HERMES = parsers.get("hermes")


def call(expression: str) -> str:
    """A calculator call as Qwen3 writes it (its template's spelling)."""
    args = f'{{"name": "calculate", "arguments": {{"expression": "{expression}"}}}}'
    return f"<tool_call>\n{args}\n</tool_call>"


def thought(reasoning: str, rest: str) -> str:
    """A turn that reasons first, as Qwen3 writes it, ended by its end-of-turn token."""
    return f"<think>\n{reasoning}\n</think>\n\n{rest}{EOT}"


# Two calls, then the answer, each turn reasoning first.
TOOL_TURNS = [
    thought("I need 12 * 3 first.", call("12 * 3")),
    thought("Now 36 + 4.", call("36 + 4")),
    thought("The calculator says 40.", "Answer: 40"),
]
# A call and an answer to the first question; the user asks on; the second answer.
FOLLOW_UP_TURNS = [
    thought("I need 12 * 3 first.", call("12 * 3")),
    thought("The calculator says 36.", "Answer: 36"),
    thought("36 + 4 is 40.", "Answer: 40"),
]


class FollowUp(CalculatorEnv):
    """The calculator whose user asks on after the first answer (a new user query: the
    point where Qwen3's template drops the reasoning of every turn before it). With
    ``fork``, the follow-up comes as a rewritten conversation instead of a reply."""

    def __init__(self, fork: bool = False) -> None:
        super().__init__(parser="hermes")
        self.fork = fork

    async def step(self, state: EnvState, message: dict) -> EnvStep:
        if HERMES.parse(message["content"]) or state.data.get("asked"):
            return await super().step(state, message)
        state.data["asked"] = True
        ask = {"role": "user", "content": FOLLOW_UP}
        if self.fork:  # the conversation as the template takes it, to be rendered afresh
            return EnvStep([*view(state.messages), ask], done=False, fork=True)
        return EnvStep([ask], done=False)


def view(messages: list[dict]) -> list[dict]:
    """The messages as the template takes them (calls as structure)."""
    return parsers.template_messages(messages, HERMES)


def reasoning_is_the_models(tok, traj: Trajectory, blocks: int) -> None:
    """``blocks`` reasoning blocks in the sequence, every one of their tokens the model's
    (mask 1), none in the prompt or the glue; and the learner's row is that sequence with
    that mask."""
    think, end = tok.convert_tokens_to_ids(["<think>", "</think>"])
    full = traj.prompt_ids + traj.completion_ids
    assert full.count(think) == full.count(end) == blocks
    assert think not in traj.prompt_ids
    for start, stop in traj.spans:  # each turn opens with its reasoning, kept whole
        span = traj.completion_ids[start:stop]
        assert span[0] == think and end in span
        assert traj.loss_mask[start:stop] == [1] * len(span)
    glue = [t for t, bit in zip(traj.completion_ids, traj.loss_mask, strict=True) if not bit]
    assert think not in glue and end not in glue  # the probe's empty block never leaks
    batch = pad([traj])
    assert batch.input_ids[0].tolist() == full
    trained = [t for t, bit in zip(full, batch.loss_mask[0].tolist(), strict=True) if bit]
    assert trained.count(think) == trained.count(end) == blocks
