"""The environment contract: ``reset`` → (``step`` per assistant turn) → ``score``.

State/message contract between an environment and the turn loop:

1. ``reset(example)`` returns an ``EnvState`` whose ``messages`` are the opening chat
   messages (system/user) and whose ``tools`` are schemas for the chat template (or None).
2. Each turn the loop generates one assistant reply, appends ``{"role": "assistant",
   "content": text}`` to ``state.messages``, adds 1 to ``state.turn``, and only then calls
   ``step(state, message)`` with that same message. It appends the returned
   ``EnvStep.messages`` to ``state.messages`` afterwards. ``advance`` does exactly this.
3. The loop calls ``step`` after every assistant turn, the last allowed one included, so
   an environment can still end the episode on it. The episode ends when a step says
   ``done`` (status ``terminated``) or after ``env.max_turns`` turns (``max_turns``).
   Messages of the final step are a closing record (kept in ``state.messages``); no
   generation follows them, so they are not rendered into the trajectory's tokens.
4. ``score(state)`` runs after the episode on the full conversation in ``state.messages``.

Methods may be ``def`` or ``async def``; callers go through ``call``, which runs sync ones
in a worker thread so environment work never blocks the event loop. Per-episode state
lives in ``EnvState`` (never on the environment object), so concurrent episodes of one
environment do not interfere; ``thread_safe = False`` says ``score`` must not run
concurrently (e.g. it drives a non-reentrant library).

Checkpoints (the replay buffer's log) store a state as plain JSON data through
``state_dict`` / ``load_state_dict`` (sync, called inline: keep them cheap). The defaults
accept states made of dicts, lists, strings, numbers, booleans and None; an environment
keeping other objects in ``state.data`` overrides both, or its interrupted episodes
restart from the prompt when a run resumes.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import functools
import inspect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomrl.data.messages import messages_problem, opening_messages
from loomrl.workers import shared_pool

Message = dict[str, Any]
Score = float | dict[str, float]


class EnvTimeout(Exception):
    """An environment call ran past its time limit (``env_timeout``, or an environment's
    own, such as an agent harness's); the episode ends with status ``env_timeout``."""


@dataclass(slots=True)
class EnvStep:
    """What the environment answers to one assistant turn.

    ``reward`` is an optional per-turn reward (shaping), kept beside the final ``score``.
    ``stop`` holds stop strings for the *next* generation only (None = sampling defaults).
    ``fork``: ``messages`` is not a reply but the whole conversation, rewritten (an agent
    harness compacted or edited its history); the loop closes the trajectory's current
    segment and renders this conversation afresh as a new one (``Trajectory.fork``).
    """

    messages: list[Message]
    done: bool
    reward: float | None = None
    stop: tuple[str, ...] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    fork: bool = False

    def __post_init__(self) -> None:
        if self.stop is not None:
            self.stop = tuple(self.stop)  # accept lists; keep the record hashable-friendly


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """The model's side of the turn just played, for environments that report it back
    (an agent harness's API answer): the sampled ids and logprobs, why generation
    stopped, and the tokens of context it was sampled after."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    context_tokens: int


@dataclass(frozen=True, slots=True)
class TurnLimits:
    """What an environment asks of the model's next turn on top of the rollout's
    sampling: more stop strings, and a smaller token cap (``max_tokens``; the rollout's
    own ``max_tokens`` and the context left still bound it)."""

    stop: tuple[str, ...] = ()
    max_tokens: int | None = None


@dataclass(slots=True, weakref_slot=True)
class EnvState:
    """One episode: the whole conversation so far plus env-specific ``data``.

    ``turn`` counts assistant messages appended by the loop (see the module contract).
    """

    messages: list[Message]
    example: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    turn: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def assistant_messages(self) -> list[str]:
        """The content of every assistant message, in order (what ``score`` usually reads)."""
        return [m["content"] for m in self.messages if m.get("role") == "assistant"]


class Environment(abc.ABC):
    """Base class for environments; a subclass usually overrides ``score`` and ``dataset``.

    The default ``reset`` opens with ``system_prompt`` (if any) and the example's
    ``question`` as the user message, or with the example's ``messages`` (an opening
    conversation); the default ``step`` ends the episode (single turn).
    """

    name: str = "env"
    max_turns: int = 1
    thread_safe: bool = True
    #: True when the sync methods are pure Python that returns in microseconds and never
    #: blocks: the loop then calls them inline instead of through the env thread pool
    #: (a thread hop costs 0.1-0.5 ms; env_timeout cannot interrupt inline calls).
    nonblocking: bool = False
    #: True when a sync ``reset`` or ``step`` may block for good (a C extension, a
    #: library call without a timeout): they then run in worker processes, each with a
    #: pickled copy of the environment, and a call past ``env_timeout`` is killed with its
    #: process (``loomrl.process_calls``). Keep episode data in the state: changes the
    #: methods make to ``self`` stay in the worker's copy. Costs a pickle of the state
    #: per call (~0.1-1 ms) and ``env_workers`` processes forked when a rollout starts.
    may_hang: bool = False
    system_prompt: str | None = None
    #: How ``EnvStep.reward`` values and ``score`` make the episode's reward: "final",
    #: "sum", "final+sum" or "discounted" (by ``turn_discount`` per turn); see
    #: ``loomrl.episode.turn_rewards``. A run may override both.
    turn_reward: str = "final"
    turn_discount: float = 1.0
    #: Tokens an env message may take in the trajectory; a longer one is cut in the
    #: middle with a marker (``loomrl.episode.observations``). None: no cap. A run may
    #: override it (``max_obs_tokens``).
    max_obs_tokens: int | None = None

    def reset(self, example: dict[str, Any]) -> EnvState:
        """Open an episode for ``example``: its ``messages`` (an opening conversation) when
        it has them, else its ``question`` as the user message; ``system_prompt`` goes
        first unless the messages open with a system message of their own."""
        if example.get("messages") is not None:
            return EnvState(messages=self._opening(example), example=example)
        if "question" not in example:
            raise ValueError(
                f"{self.name}: example {example.get('id')!r} has no 'question' or 'messages'; "
                "override reset() for examples of another shape"
            )
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": str(example["question"])})
        return EnvState(messages=messages, example=example)

    def _opening(self, example: dict[str, Any]) -> list[Message]:
        """The example's messages, checked and copied (the episode appends to its own)."""
        problem = messages_problem(example["messages"])
        if problem:
            raise ValueError(f"{self.name}: example {example.get('id')!r}: messages: {problem}")
        messages = opening_messages(example["messages"])
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def step(self, state: EnvState, message: Message) -> EnvStep:
        """Answer one assistant turn; single-turn by default, so the episode ends here."""
        return EnvStep(messages=[], done=True)

    def record_turn(self, state: EnvState, turn: TurnRecord) -> None:
        """Called (sync, inline) with each model turn just before ``step`` sees its
        message; most environments need only the message and leave this alone."""
        return None

    def turn_limits(self, state: EnvState) -> TurnLimits | None:
        """Limits for the model's next turn (sync, inline, before each request of it);
        None: the rollout's own. An agent harness passes on its request's ``stop`` and
        ``max_tokens`` this way."""
        return None

    @abc.abstractmethod
    def score(self, state: EnvState) -> Score:
        """The episode's reward: a float, or named components whose sum is the reward."""

    async def score_many(self, states: Sequence[EnvState]) -> list[Score]:
        """Score a group at once; override for batched scorers (e.g. a reward model)."""
        if self.thread_safe:
            return list(await asyncio.gather(*(call(self.score, s) for s in states)))
        return [await call(self.score, s) for s in states]

    def use_chat_template(self, chat_template: str) -> None:
        """Called by the rollout, before it resets an episode, with the chat template the
        model's prompts are rendered with: an environment whose behaviour follows the
        model's format settles it here (``ToolEnv(parser="auto")`` picks its tool-call
        parser). Default: nothing."""
        return None

    def run_info(self) -> dict[str, Any]:
        """Facts about this environment's setup that a run records beside its metrics
        (e.g. ``{"sandbox": "bwrap"}``): plain strings and numbers. Default: none."""
        return {}

    def cleanup(self, state: EnvState) -> None:
        """Free what the episode holds outside ``state`` (a sandbox process, temp files).

        Called by the rollout once the episode is over for good: after it is scored, or
        when it ends in an error, a timeout, an abort, a restart or a cancelled rollout.
        Sync, quick and never raising (a failure is reported as a warning); it may still
        see the same state again when a checkpointed episode resumes, so keep it
        idempotent and let a later ``step`` start afresh. The default does nothing.
        """
        return None  # an optional hook: most environments hold nothing outside the state

    async def aclose(self) -> None:
        """Free what the environment holds for the whole run (a tool server it started):
        called once when the run that built it ends. The default does nothing."""
        return None

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` JSON-serialisable examples, deterministic in ``seed``, with ``id`` 0..n-1."""
        raise TypeError(f"environment {self.name!r} does not generate examples; pass your own")

    def state_dict(self, state: EnvState) -> dict[str, Any]:
        """``state`` as plain JSON data, so an interrupted episode can be checkpointed.

        The default keeps the fields as they are and raises ``TypeError`` (naming the
        value) when one is not plain data: a tuple, a set, an object, a non-string key.
        Override it with ``load_state_dict`` to save such a state in your own terms.
        """
        return plain_state(state)

    def load_state_dict(self, data: dict[str, Any]) -> EnvState:
        """The state ``state_dict`` returned ``data`` for (the inverse; never runs code
        named by the data). Raises ``ValueError`` when ``data`` is not such a state."""
        return state_from_plain(data)


async def call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Await ``fn(*args, **kwargs)``: coroutine functions directly, sync ones in a thread.

    Sync ones run on ``loomrl.workers.shared_pool()`` (daemon threads, as
    ``asyncio.to_thread`` would but never joined at exit: a call the caller stopped
    waiting for cannot keep the process alive), with the caller's context variables.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    bound = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    result = await asyncio.get_running_loop().run_in_executor(shared_pool(), bound)
    if inspect.isawaitable(result):  # e.g. a callable object with an async __call__
        return await result
    return result


async def advance(env: Environment, state: EnvState, content: str) -> EnvStep:
    """Play one assistant turn following the module contract; return the env's answer."""
    message: Message = {"role": "assistant", "content": content}
    state.messages.append(message)
    state.turn += 1
    result: EnvStep = await call(env.step, state, message)
    state.messages.extend(result.messages)
    return result


def split_score(score: Score) -> tuple[float, dict[str, float]]:
    """``(reward, components)``: a dict score's reward is the sum of its components."""
    if isinstance(score, dict):
        components = {str(k): _finite(v, f"score component {k!r}") for k, v in score.items()}
        return math.fsum(components.values()), components
    return _finite(score, "score"), {}


def make_dataset(
    n: int, seed: int, make_one: Callable[[random.Random], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``n`` examples drawn in order from ``Random(seed)``; a prefix never depends on ``n``."""
    if n < 0:
        raise ValueError(f"dataset size must be >= 0, got {n}")
    rng = random.Random(seed)
    return [{"id": i, **make_one(rng)} for i in range(n)]


def check_plain(value: Any, where: str = "value") -> None:
    """Raise ``TypeError`` naming the first part of ``value`` that JSON would not give back
    as it is: only dict (string keys), list, str, int, float, bool and None pass, exactly
    (a tuple would come back a list, an int subclass a plain int)."""
    todo: list[tuple[Any, str]] = [(value, where)]
    while todo:
        item, path = todo.pop()
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind is list:
            todo += [(x, f"{path}[{i}]") for i, x in enumerate(item)]
        elif kind is dict:
            for key, x in item.items():
                if type(key) is not str:
                    raise TypeError(f"{path} has a key {key!r} that is not a string")
                todo.append((x, f"{path}[{key!r}]"))
        else:
            raise TypeError(f"{path} is a {kind.__name__}, not plain JSON data")


def plain_state(state: EnvState) -> dict[str, Any]:
    """The default ``Environment.state_dict``: the fields as they are, if plain data."""
    data = {
        "messages": state.messages, "example": state.example, "tools": state.tools,
        "turn": state.turn, "data": state.data,
    }  # fmt: skip
    for key, value in data.items():
        check_plain(value, f"state.{key}")
    return data


def state_from_plain(data: dict[str, Any]) -> EnvState:
    """The default ``Environment.load_state_dict``: checks each field's shape."""
    if type(data) is not dict:
        raise ValueError(f"an env state must be an object, got {type(data).__name__}")
    expected = {"messages", "example", "tools", "turn", "data"}
    if set(data) != expected:
        raise ValueError(f"an env state has the fields {sorted(expected)}, got {sorted(data)}")
    messages, tools, turn = data["messages"], data["tools"], data["turn"]
    if type(messages) is not list or any(type(m) is not dict for m in messages):
        raise ValueError("state.messages must be a list of objects")
    if tools is not None and type(tools) is not list:
        raise ValueError("state.tools must be a list or null")
    if type(turn) is not int or turn < 0:
        raise ValueError(f"state.turn must be an integer >= 0, got {turn!r}")
    for key in ("example", "data"):
        if type(data[key]) is not dict:
            raise ValueError(f"state.{key} must be an object")
    return EnvState(messages, data["example"], tools, turn, data["data"])


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")
    return float(value)
