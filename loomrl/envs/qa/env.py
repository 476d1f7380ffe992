"""``qa``: questions from your data, answers checked by a verifiable reward chosen by name.

Examples (``loomrl.data`` loads them; the environment generates none) open with
``messages`` (the chat that opens the episode, used as it is; the system prompt goes first
unless it starts with one) or, when those are absent or null, ``question`` (the user
message; a ``choices`` list is rendered under it as ``A. ...`` lines), and carry
``answer``, the reference each reward reads (``loomrl.answers.compare``,
``loomrl.answers.choice``).

``max_attempts > 1`` is the retry shape: after a wrong reply the environment says so
(``retry_prompt``, plus the format hint when the reply missed the asked form) without
revealing the answer, and the episode ends at the first right reply or after
``max_attempts`` replies. Reward components: ``correct`` (1 when the last reply is
right), ``attempt_penalty`` (``-attempt_penalty`` per extra attempt, on a right answer
only; present when ``max_attempts > 1`` and the penalty is not 0) and ``format``
(``format_weight`` when the last reply used the asked form; present when the weight is
not 0). Each step's ``info`` holds ``attempts`` and ``correct``; a trajectory's ``turns``
is its number of attempts.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

from loomrl.answers import choice, compare
from loomrl.answers.compare import AnswerFormat, MatchMode
from loomrl.answers.mathverify import INSTALL_HINT, GoldError
from loomrl.answers.registry import make_check
from loomrl.envs.base import Environment, EnvState, EnvStep, Message
from loomrl.envs.qa import prompts
from loomrl.envs.qa.prompts import RewardName

DEFAULT_RETRY = "That is not correct. Try again ({left} attempts left)."


class QAEnv(Environment):
    """Question answering over data with a ``math_verify``, ``exact``, ``regex`` or
    ``choice`` reward, a format bonus, and an optional retry loop (see the module)."""

    name = "qa"

    def __init__(
        self,
        reward: RewardName = "math_verify",
        max_attempts: int = 1,
        system_prompt: str | None = None,
        format_weight: float = 0.0,
        pattern: str | None = None,
        match: MatchMode = "full",
        answer_format: AnswerFormat | None = None,
        attempt_penalty: float = 0.0,
        retry_prompt: str = DEFAULT_RETRY,
        math_timeout: float = 5.0,
    ) -> None:
        """``reward``: how replies are checked. ``max_attempts``: replies per episode (1:
        single turn). ``system_prompt``: None gives the reward's default (the task and the
        answer format), ``""`` none. ``format_weight``: the ``format`` component's value.
        ``pattern`` (``regex`` only): the pattern every example is checked with; None reads
        each example's ``answer`` as its pattern. ``match`` (``regex`` only): ``full``
        (the final answer matches all of it) or ``search`` (found anywhere in the reply).
        ``answer_format``: ``boxed`` or ``line`` (``Answer: ...``); None is ``boxed``
        for ``math_verify``, ``line`` otherwise. ``attempt_penalty``: taken per extra
        attempt from a right answer. ``retry_prompt``: the reply to a wrong answer
        (``{left}`` is the attempts left). ``math_timeout``: seconds per math-verify check.
        """
        if reward not in prompts.REWARDS:
            raise ValueError(
                f"unknown reward {reward!r}; known rewards: {', '.join(prompts.REWARDS)}"
            )
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if attempt_penalty < 0 or attempt_penalty * (max_attempts - 1) >= 1:
            raise ValueError(
                f"attempt_penalty * (max_attempts - 1) must stay in [0, 1), got "
                f"{attempt_penalty} * {max_attempts - 1}"
            )
        if not math.isfinite(format_weight):
            raise ValueError(f"format_weight must be finite, got {format_weight}")
        if reward != "regex" and (pattern is not None or match != "full"):
            raise ValueError("pattern and match are for reward='regex' only")
        try:
            retry_prompt.format(left=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"retry_prompt may only use {{left}}: {exc!r}") from None
        if reward == "math_verify" and importlib.util.find_spec("math_verify") is None:
            raise ImportError(
                f"the math_verify reward needs the package math-verify: {INSTALL_HINT}"
            )
        self.reward, self.max_attempts, self.max_turns = reward, max_attempts, max_attempts
        self.format_weight, self.attempt_penalty = format_weight, attempt_penalty
        self.retry_prompt, self.match = retry_prompt, match
        self.answer_format = answer_format or prompts.DEFAULT_FORMAT[reward]
        self.pattern = pattern
        if system_prompt is None:
            system_prompt = prompts.default_prompt(reward, self.answer_format)
        self.system_prompt = system_prompt or None
        kwargs: dict[str, Any] = {"math_verify": {"timeout_s": math_timeout}}.get(reward, {})
        if reward == "regex":
            kwargs = {"pattern": pattern, "match": match}
        self.check = make_check(reward, **kwargs)
        self.checker = getattr(self.check, "checker", None)  # math_verify's child processes
        # Pure Python, microseconds a call: run inline. math-verify waits on a child process.
        self.nonblocking = reward != "math_verify"

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        raise TypeError(
            f"environment {self.name!r} needs data: pass examples with 'question' (or "
            "'messages') and 'answer' (--data on the command line)"
        )

    def reset(self, example: dict[str, Any]) -> EnvState:
        self.reference(example)  # a bad example fails here, before any generation
        messages = _opening(example, self.system_prompt)
        return EnvState(messages=messages, example=example, data={"opening": len(messages)})

    def step(self, state: EnvState, message: Message) -> EnvStep:
        attempts = len(_replies(state))
        if self.max_attempts == 1:
            return EnvStep([], done=True, info={"attempts": attempts})
        reply = _text(message)
        correct = self.correct(reply, state.example)
        state.data.setdefault("verdicts", []).append(correct)
        info = {"attempts": attempts, "correct": correct}
        if correct or attempts >= self.max_attempts:
            return EnvStep([], done=True, info=info)
        feedback = self.retry_prompt.format(left=self.max_attempts - attempts)
        if not compare.formatted(reply, self.answer_format):
            feedback += " " + prompts.format_hint(self.answer_format, self.reward)
        return EnvStep([{"role": "user", "content": feedback}], done=False, info=info)

    def score(self, state: EnvState) -> dict[str, float]:
        replies = _replies(state)[: self.max_attempts]
        last = replies[-1] if replies else ""
        verdicts = state.data.get("verdicts", [])
        if replies and len(verdicts) >= len(replies):
            correct = bool(verdicts[len(replies) - 1])  # step checked it already
        else:
            correct = bool(replies) and self.correct(last, state.example)
        components = {"correct": float(correct)}
        if self.max_attempts > 1 and self.attempt_penalty:
            extra = len(replies) - 1
            components["attempt_penalty"] = -self.attempt_penalty * extra if correct else 0.0
        if self.format_weight:
            ok = compare.formatted(last, self.answer_format)
            components["format"] = self.format_weight if ok else 0.0
        return components

    def correct(self, reply: str, example: dict[str, Any]) -> bool:
        """Whether ``reply`` answers ``example`` rightly; raises only for a bad example."""
        ref = self.reference(example)
        try:
            return self.check.correct(reply, ref)
        except GoldError as exc:
            raise ValueError(f"{self.name}: example {example.get('id')!r}: {exc}") from None

    def reference(self, example: dict[str, Any]) -> Any:
        """The example's reference in the form the reward compares with; a ValueError
        naming the example when it has none or it cannot be used. Cheap: call it to check
        a data set before a run."""
        if not isinstance(example, dict):
            raise ValueError(f"{self.name}: an example must be an object, got {example!r:.80}")
        where = f"{self.name}: example {example.get('id')!r}"
        needs_answer = not (self.reward == "regex" and self.pattern is not None)
        if needs_answer and example.get("answer") is None:
            raise ValueError(
                f"{where} has no 'answer' (the reference the {self.reward} reward reads)"
            )
        try:
            return self.check.reference(example)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def _opening(example: dict[str, Any], system_prompt: str | None) -> list[Message]:
    """The episode's opening messages (module docstring); a copy, never the example's own."""
    where = f"example {example.get('id')!r}"
    if example.get("messages") is not None:  # a null messages column falls back to question
        given = example["messages"]
        if not isinstance(given, list) or not given:
            raise ValueError(f"qa: {where}: 'messages' must be a non-empty list of messages")
        for m in given:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
                raise ValueError(f"qa: {where}: each message needs a 'role', got {m!r:.80}")
            if not isinstance(m.get("content"), str):
                raise ValueError(f"qa: {where}: each message needs text 'content', got {m!r:.80}")
        messages = [dict(m) for m in given]
        if system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system_prompt})
        return messages
    if "question" not in example:
        raise ValueError(f"qa: {where} has neither 'question' nor 'messages'")
    question = str(example["question"])
    if example.get("choices") is not None:
        question = prompts.render(question, choice.check_choices(example["choices"]))
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": question}]


def _replies(state: EnvState) -> list[str]:
    """The model's replies: assistant messages after the opening (a ``messages`` example
    may hold assistant turns of its own, e.g. few-shot ones)."""
    opening = state.data.get("opening", 0)
    return [_text(m) for m in state.messages[opening:] if m.get("role") == "assistant"]


def _text(message: Message) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""
