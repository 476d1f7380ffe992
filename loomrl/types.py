"""The records that move between loomrl's stages.

Hot-path records are slotted dataclasses rather than pydantic models: a rollout creates
one per turn, and validation cost there is paid millions of times per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]
"""How an engine request ended; a trajectory's span may also end ``fire`` or ``sync``
(``CONTINUED``)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one generation samples; engines translate it to their own parameter object.

    ``max_tokens`` is clamped by engines to the context left after the prompt, so a
    request never fails for asking more than fits: it ends with ``finish_reason="length"``.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0  # drop tokens below min_p × the most probable one's probability
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    #: FIRE sampling (Flaming-hot Initiation with Regular Execution): the first
    #: ``first_tokens`` tokens of a turn are sampled at ``first_token_temperature``, the
    #: rest at ``temperature``, on every turn or only the episode's first (``fire_turns``).
    #: The rollout applies it (two requests per turn, one trajectory, no re-tokenising;
    #: each span records its temperature); engines only ever see plain requests.
    first_token_temperature: float | None = None
    first_tokens: int = 1
    fire_turns: Literal["all", "first"] = "all"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # one stop string, not one per character
            object.__setattr__(self, "stop", (self.stop,))
        problems = []
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            problems.append(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            problems.append(f"min_p must be in [0, 1), got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            problems.append(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if any(not s for s in self.stop):
            problems.append("stop strings must be non-empty")
        hot = self.first_token_temperature
        if hot is not None and not 0 < hot < float("inf"):
            problems.append(f"first_token_temperature must be > 0 (or None), got {hot}")
        if self.first_tokens < 1:
            problems.append(f"first_tokens must be >= 1, got {self.first_tokens}")
        if self.fire_turns not in ("all", "first"):
            problems.append(f"fire_turns must be 'all' or 'first', got {self.fire_turns!r}")
        if problems:
            raise ValueError("invalid SamplingParams: " + "; ".join(problems))
        # Accept lists from callers and TOML files, keep tuples so the record stays hashable.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))


@dataclass(slots=True)
class Completion:
    """One generation: the sampled ids and the logprob of exactly each of them.

    ``stop_reason`` is the stop string or stop token id that ended the generation
    (``None`` for EOS, length or abort). ``policy_version`` is the engine's weight
    version when the request finished.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    policy_version: int = 0
    stop_reason: str | int | None = None
    prompt_len: int = 0
    request_id: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"completion {self.request_id!r} has {len(self.token_ids)} token ids "
                f"but {len(self.logprobs)} logprobs"
            )


class Status(StrEnum):
    """How a trajectory ended.

    ``terminated``: the environment said done. ``max_turns``: the turn limit came first.
    ``truncated``: the context budget (``max_len``) ran out. ``env_timeout``: an
    environment call exceeded its time limit. ``error``: an environment, scorer or engine
    call raised (the message is in ``Trajectory.error``). ``aborted``: the engine aborted
    a generation (e.g. for a weight update); the tokens so far are kept.
    """

    TERMINATED = "terminated"
    MAX_TURNS = "max_turns"
    TRUNCATED = "truncated"
    ENV_TIMEOUT = "env_timeout"
    ERROR = "error"
    ABORTED = "aborted"


@dataclass(slots=True)
class Trajectory:
    """One episode as token ids, the one currency between loomrl's stages.

    ``completion_ids`` holds everything after the prompt: model tokens (``loss_mask`` 1,
    their sampling logprob) and environment glue tokens (``loss_mask`` 0, logprob 0.0),
    concatenated in order; the three lists always have equal length. ``spans`` lists the
    ``(start, end)`` offsets of each model turn in ``completion_ids`` (several adjacent
    spans when a turn was generated in pieces: a weight update cut it, ``abort``, or FIRE
    sampled its first tokens hot, ``fire``) and ``span_versions`` the engine's policy
    version that produced each span; ``policy_version`` is the oldest of them.
    """

    example_id: int
    group_id: int
    sample_index: int
    env: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    span_versions: list[int] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    #: The temperature each span was sampled at (FIRE samples a turn's first tokens hot:
    #: a span of its own, finish reason ``fire``); empty in records older than it.
    span_temperatures: list[float] = field(default_factory=list)
    turns: int = 0
    status: Status = Status.TERMINATED
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    turn_rewards: list[float | None] = field(default_factory=list)
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: Counts the environment reported, summed over the episode's steps (each
    #: ``EnvStep.info["metrics"]``): e.g. ``tool_calls``, ``tool_errors``, ``sandbox_s``.
    env_metrics: dict[str, float] = field(default_factory=dict)
    #: Earlier segments of a forked episode, oldest first (see ``fork``); the fields
    #: above hold the last one. Each is a closed, token-exact sequence of its own.
    segments: list[Trajectory] = field(default_factory=list)
    #: The images of a vision-language episode, by pixel hash (``loomrl.vision``), in the
    #: order of their blocks in ``prompt_ids + completion_ids``.
    images: list[str] = field(default_factory=list)

    @property
    def policy_version(self) -> int:
        own = min(self.span_versions, default=0)
        if not self.segments:
            return own
        earlier = min(s.policy_version for s in self.segments)
        return min(own, earlier) if self.span_versions else earlier

    def fork(self, prompt_ids: list[int], messages: list[dict[str, Any]]) -> None:
        """Close the current segment and open a new one from ``prompt_ids``.

        For episodes whose conversation was rewritten (an agent harness compacting or
        editing its history): the tokens sampled so far stay exactly as they were, in a
        segment of their own, and the new history is rendered afresh instead of being
        spliced onto them. Training uses every segment as its own sequence.
        """
        closed = Trajectory(
            example_id=self.example_id, group_id=self.group_id,
            sample_index=self.sample_index, env=self.env, prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids, logprobs=self.logprobs,
            loss_mask=self.loss_mask, messages=self.messages, spans=self.spans,
            span_versions=self.span_versions, finish_reasons=self.finish_reasons,
            span_temperatures=self.span_temperatures, turns=len(turn_bounds(self)),
            status=Status.TERMINATED, images=self.images,
        )  # fmt: skip
        self.segments.append(closed)
        self.prompt_ids, self.messages = prompt_ids, messages
        self.completion_ids, self.logprobs, self.loss_mask = [], [], []
        self.spans, self.span_versions, self.finish_reasons = [], [], []
        self.span_temperatures, self.images = [], []

    def all_segments(self) -> list[Trajectory]:
        """Every token sequence of the episode, oldest first (just ``[self]`` unforked)."""
        return [*self.segments, self]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_completion_tokens(self) -> int:
        """Tokens the model generated (mask 1)."""
        return sum(end - start for start, end in self.spans)

    @property
    def num_env_tokens(self) -> int:
        """Glue tokens the environment and template contributed (mask 0)."""
        return len(self.completion_ids) - self.num_completion_tokens


#: Finish reasons of a span the next span of the same turn continues: a weight update
#: aborted it (``abort``, continued by a new request) or kept it running into the new
#: weights (``sync``, vLLM's keep mode), or FIRE sampled it hot (``fire``).
CONTINUED = frozenset({"abort", "sync", "fire"})
#: Finish reasons of a span a weight update ended (the turn went on under the new weights).
SYNC_CUT = frozenset({"abort", "sync"})


def turn_bounds(traj: Trajectory) -> list[tuple[int, int]]:
    """``(start, end)`` of each model turn of the current segment, in completion offsets
    (a piece that ended ``abort`` or ``fire`` and the piece continuing it are one turn)."""
    bounds: list[tuple[int, int]] = []
    end = -1
    for (start, stop), reason in zip(traj.spans, traj.finish_reasons, strict=True):
        if start == end and bounds:
            bounds[-1] = (bounds[-1][0], stop)
        else:
            bounds.append((start, stop))
        end = stop if reason in CONTINUED else -1
    return bounds
