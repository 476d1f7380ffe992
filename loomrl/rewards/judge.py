"""``Judge``: an LLM judge through any loomrl ``Engine``, with a strict score parser.

The prompt is ``template.format(...)`` with the fields ``question`` (or ``prompt``: the
user message answered), ``answer`` (or ``completion``: the reply judged), ``reference``
(``example[reference_key]``, ``""`` if absent), ``low`` and ``high`` (literal braces in a
template are doubled: ``{{``). A template must show the reply. ``chat`` may be None: the
engine's own tokenizer is then used (a server engine is asked for it on first use). It
is sent as one user message (after ``system``, if given) through the judge's chat template.

Parsing is strict: the reply must contain exactly one line ``Score: <number>`` (the word
``Score`` in any case, a plain decimal number, nothing else on the line) with the number
in ``[low, high]``. Anything else is a parse failure. Policy (``on_parse_error``):

* ``"raise"`` (default): ``JudgeParseError`` naming the problem and quoting the reply.
* ``"fallback"``: the verdict has ``score=None, ok=False`` and the reward source returns
  ``fallback`` for that sample; ``parse_failures`` counts such replies.

Scores are mapped to ``[0, 1]`` (``(s - low) / (high - low)``) unless ``normalize=False``.
"""

from __future__ import annotations

import asyncio
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from loomrl.aio import gather_or_cancel
from loomrl.engines.base import Engine
from loomrl.rewards.base import RewardError, RewardSample
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams

DEFAULT_TEMPLATE = """Rate how well the response answers the question.

Question:
{prompt}

Reference answer (may be empty):
{reference}

Response:
{completion}

Think briefly, then end with one line of the form "Score: N", where N is a number \
from {low} to {high} ({high} is best)."""

FIELDS = frozenset({"question", "prompt", "answer", "completion", "reference", "low", "high"})


def template_problem(template: str) -> str | None:
    """Why ``template`` cannot be a judge prompt (bad braces, an unknown field, no field
    showing the reply), or None when it can."""
    try:
        used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        return f"invalid judge template: {exc} (double literal braces)"
    unknown = sorted(used - FIELDS)
    if unknown:
        return (
            f"judge template uses unknown field(s) {unknown}; "
            f"available: {', '.join(sorted(FIELDS))}"
        )
    if not used & {"answer", "completion"}:
        return "judge template never shows the {answer} it should judge"
    return None


_SCORE_LINE = re.compile(r"^[ \t]*score[ \t]*:(.*)$", re.I | re.M)
# No two adjacent quantifiers can share characters (``[ \t]*\.?[ \t]*`` would rescan a
# long run of spaces once per split point): linear on any line.
_NUMBER = re.compile(r"[ \t]*([-+]?(?:\d+(?:\.\d*)?|\.\d+))[ \t]*(?:\.[ \t]*)?")


class JudgeParseError(RewardError):
    """A judge reply without exactly one valid ``Score: N`` line."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judgement: ``score`` (normalised unless asked not to) or None when unparsed."""

    score: float | None
    raw_score: float | None
    reply: str
    ok: bool
    error: str | None = None


def parse_score(reply: str, low: float, high: float) -> float:
    """The number on the reply's only ``Score:`` line; ``ValueError`` saying what is wrong."""
    lines = _SCORE_LINE.findall(reply)
    if not lines:
        raise ValueError("no 'Score: <number>' line")
    if len(lines) > 1:
        raise ValueError(f"{len(lines)} 'Score:' lines, expected exactly one")
    match = _NUMBER.fullmatch(lines[0])
    if match is None:
        raise ValueError(f"the Score line holds {lines[0].strip()!r:.60}, not a plain number")
    value = float(match.group(1))
    if not low <= value <= high:
        raise ValueError(f"score {value:g} is outside [{low:g}, {high:g}]")
    return value


class Judge:
    """A ``RewardSource``: one judge generation per sample, parsed strictly."""

    def __init__(
        self,
        engine: Engine,
        chat: ChatTokenizer | None = None,
        *,
        template: str = DEFAULT_TEMPLATE,
        system: str | None = None,
        low: float = 0.0,
        high: float = 10.0,
        normalize: bool = True,
        reference_key: str = "answer",
        sampling: SamplingParams | None = None,
        on_parse_error: Literal["raise", "fallback"] = "raise",
        fallback: float = 0.0,
        max_concurrency: int = 64,
    ) -> None:
        problem = template_problem(template)
        if problem is not None:
            raise ValueError(problem)
        if not low < high:
            raise ValueError(f"need low < high, got low={low}, high={high}")
        if on_parse_error not in ("raise", "fallback"):
            raise ValueError(
                f"on_parse_error must be 'raise' or 'fallback', got {on_parse_error!r}"
            )
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.engine, self.chat, self.template, self.system = engine, chat, template, system
        self.low, self.high, self.normalize = float(low), float(high), normalize
        self.reference_key = reference_key
        self.sampling = sampling or SamplingParams(max_tokens=512, temperature=0.0)
        self.on_parse_error, self.fallback = on_parse_error, float(fallback)
        self.max_concurrency = max_concurrency
        self.parse_failures = 0

    def prompt(self, sample: RewardSample) -> str:
        """The judge's user message for ``sample``."""
        return self.template.format(
            prompt=sample.prompt,
            question=sample.prompt,
            completion=sample.completion,
            answer=sample.completion,
            reference=sample.example.get(self.reference_key, ""),
            low=f"{self.low:g}",
            high=f"{self.high:g}",
        )

    async def judge(self, sample: RewardSample) -> Verdict:
        """Generate and parse one judgement (``on_parse_error`` applies to the reply)."""
        messages = [{"role": "user", "content": self.prompt(sample)}]
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        chat = self.chat if self.chat is not None else await self._chat()
        completion = await self.engine.generate(chat.prompt_ids(messages), self.sampling)
        reply = completion.text
        try:
            if completion.finish_reason == "abort":
                raise ValueError("the judge generation was aborted")
            raw = parse_score(reply, self.low, self.high)
        except ValueError as exc:
            cut = " (cut at max_tokens)" if completion.finish_reason == "length" else ""
            problem = f"{exc}{cut}"
            if self.on_parse_error == "raise":
                raise JudgeParseError(
                    f"judge reply unusable: {problem}; reply: {reply[-300:]!r}"
                ) from None
            self.parse_failures += 1
            return Verdict(score=None, raw_score=None, reply=reply, ok=False, error=problem)
        score = (raw - self.low) / (self.high - self.low) if self.normalize else raw
        return Verdict(score=score, raw_score=raw, reply=reply, ok=True)

    async def _chat(self) -> ChatTokenizer:
        """The engine's tokenizer as a ``ChatTokenizer`` (a server engine checked first)."""
        check = getattr(self.engine, "check", None)
        if check is not None:
            await check()
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is None:
            raise RewardError(f"the judge's engine {self.engine!r} has no tokenizer: pass chat=")
        self.chat = ChatTokenizer(tokenizer)
        return self.chat

    async def judge_many(self, samples: Sequence[RewardSample]) -> list[Verdict]:
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(sample: RewardSample) -> Verdict:
            async with gate:
                return await self.judge(sample)

        return await gather_or_cancel([one(s) for s in samples])

    async def __call__(self, samples: Sequence[RewardSample]) -> list[float]:
        verdicts = await self.judge_many(samples)
        return [self.fallback if v.score is None else v.score for v in verdicts]

    def __repr__(self) -> str:
        return f"Judge(scale=[{self.low:g}, {self.high:g}], on_parse_error={self.on_parse_error!r})"
