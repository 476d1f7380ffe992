"""``HarnessEnv``: an agent program that talks to the model over the OpenAI chat API,
played as a token-exact episode.

The program (an async function or a command) is started by ``reset`` and its first
request becomes the prompt. Each model turn answers the waiting request; the next
request's new messages (tool results, user turns) become the environment's glue, or,
when the program rewrote its history, a fork (a new segment rendered afresh, see
``loomrl.harness.conversation``). The program's end ends the episode; ``reward`` (or
the program's own reported reward) scores it. Sampling is the rollout's, whatever the
requests say (``loomrl.harness.protocol``).
"""

from __future__ import annotations

import asyncio
import importlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loomrl import parsers
from loomrl.envs.base import (
    Environment,
    EnvState,
    EnvStep,
    EnvTimeout,
    Message,
    Score,
    TurnLimits,
    TurnRecord,
    call,
    split_score,
)
from loomrl.harness.conversation import (
    answer_message,
    as_template,
    before_stop,
    echoed_ids,
    extension,
    rendered,
)
from loomrl.harness.program import HarnessFunction, HarnessRun, Program, ProgramExit
from loomrl.harness.protocol import Answer, ChatRequest
from loomrl.harness.server import HarnessServer
from loomrl.harness.session import Session

ExampleMaker = Callable[[int, int], list[dict[str, Any]]]  # (n, seed) -> examples


class HarnessError(RuntimeError):
    """The harness program failed: it raised, exited non-zero, or never asked."""


@dataclass(frozen=True, slots=True)
class HarnessOutcome:
    """What a reward function sees: the example, the conversation as the program saw it
    (OpenAI messages, the model's last answer included), and the program's result (its
    return value, or a command's ``ProgramExit``; None when the episode ended first)."""

    example: dict[str, Any]
    messages: list[Message]
    result: Any
    finished: bool


@dataclass(slots=True)
class _Episode:
    session: Session
    program: Program
    deadline: float
    request: ChatRequest | None = None
    turn: TurnRecord | None = None
    reported: dict[str, int] = field(default_factory=dict)  # counts already sent as metrics
    extended: int = 0  # later requests that extended the conversation
    forked: int = 0  # ... and that rewrote it
    issued: set[str] = field(default_factory=set)  # call ids given so far (``_call_id``)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # in ids of free form


class HarnessEnv(Environment):
    """Episodes played by a harness program; see the module docstring.

    ``program``: an async function taking a ``HarnessRun`` (or ``"module:function"``);
    ``command``: an argv list run per episode instead. ``reward(outcome)`` scores an
    episode (sync or async, a number or named components); without it the program's
    result is the reward (a number, or ``{"reward": x}``; a command prints it as the
    last line of its stdout). ``examples`` (a list, or ``fn(n, seed)``) are the episodes'
    examples for ``dataset``. ``timeout`` bounds an episode's wall time in seconds.
    """

    name = "harness"
    max_turns = 32
    nonblocking = True  # the episode's methods are async; the sync hooks only set fields

    def __init__(
        self,
        program: HarnessFunction | str | None = None,
        *,
        command: Sequence[str] | None = None,
        reward: Callable[[HarnessOutcome], Any] | str | None = None,
        examples: Sequence[dict[str, Any]] | ExampleMaker | str | None = None,
        parser: str = "hermes",
        tools_in_prompt: bool = True,
        timeout: float = 600.0,
        max_turns: int | None = None,
        model: str = "loomrl",
    ) -> None:
        if (program is None) == (command is None):
            raise ValueError("HarnessEnv takes exactly one of program= and command=")
        if command is not None and (
            isinstance(command, str) or not command or not all(isinstance(a, str) for a in command)
        ):
            raise ValueError(f"command must be a non-empty list of strings, got {command!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.program = _resolve(program, "program")
        self.command = None if command is None else list(command)
        self.reward = _resolve(reward, "reward")
        self.examples = _resolve(examples, "examples")
        self.parser = parsers.get(parser)
        self.tools_in_prompt, self.timeout, self.model = tools_in_prompt, timeout, model
        if max_turns is not None:
            self.max_turns = max_turns
        self.server = HarnessServer(model)

    # -- the episode -------------------------------------------------------------------------
    async def reset(self, example: dict[str, Any]) -> EnvState:
        session = await self.server.open_session()
        run = HarnessRun(example, session.base_url, session.key, self.model)
        program = None
        try:
            if self.command is not None:
                program = await Program.start_command(self.command, run)
            else:
                program = Program.start_function(self.program, run)
            loop = asyncio.get_running_loop()
            episode = _Episode(session, program, loop.time() + self.timeout)
            try:
                request = await self._next(episode)
            except HarnessError as exc:
                raise HarnessError(f"{exc} (before its first request)") from None
            if request is None:  # it ended well (a failure raised above) but never asked
                raise HarnessError("the harness ended before its first request")
        except BaseException:
            if program is not None:
                program.kill()
            self.server.close_session(session, "the episode failed to start")
            raise
        session.api, session.tools = list(request.messages), request.tools
        return EnvState(
            messages=self._rendered(episode, request),
            example=example,
            tools=None if self.tools_in_prompt else request.tools,
            data={"episode": episode},
        )

    def turn_limits(self, state: EnvState) -> TurnLimits | None:
        """The waiting request's ``stop`` and ``max_tokens``: its turn ends where it would
        in deployment (the rollout's ``max_tokens`` still bounds it)."""
        request = state.data["episode"].request
        if request is None or not (request.stop or request.max_tokens):
            return None
        return TurnLimits(stop=request.stop, max_tokens=request.max_tokens)

    def record_turn(self, state: EnvState, turn: TurnRecord) -> None:
        state.data["episode"].turn = turn

    async def step(self, state: EnvState, message: Message) -> EnvStep:
        episode: _Episode = state.data["episode"]
        session, request = episode.session, episode.request
        assert request is not None
        offered = session.tools if request.tool_choice == "auto" else None
        text = before_stop(message["content"], request.stop, request.keep_stop)
        api_message, invalid = answer_message(
            text, self.parser, offered, lambda given: self._answer_id(episode, given)
        )
        if api_message.get("tool_calls"):  # the turn read as structure, beside its text
            message["tool_calls"] = as_template(api_message)["tool_calls"]
        session.api.append(api_message)
        turn, episode.turn = episode.turn, None
        session.answer(self._answer(api_message, turn, request))
        counts = {"harness/invalid_tool_calls": invalid}
        request = await self._next(episode)
        if request is None:
            later = episode.extended + episode.forked
            if later:  # the episode's prefix-match rate, once (env metrics sum over steps)
                counts["harness/prefix_match_rate"] = episode.extended / later
            return EnvStep(messages=[], done=True, info={"metrics": self._counts(episode, counts)})
        added = extension(session.api, request.messages) if request.tools == session.tools else None
        if added is None:  # the program rewrote its history (or changed its tools)
            episode.forked += 1
            session.api, session.tools = list(request.messages), request.tools
            if not self.tools_in_prompt:
                state.tools = request.tools
            messages = self._rendered(episode, request)
            info = {"metrics": self._counts(episode, counts)}
            return EnvStep(messages=messages, done=False, fork=True, info=info)
        ids = echoed_ids(session.api, request.messages)  # the calls' ids, as answered
        session.api += added
        episode.extended += 1
        counts["harness/extended"] = 1
        replies = rendered(
            added, None, self.parser, False, lambda given: self._call_id(episode, given, ids)
        )
        return EnvStep(
            messages=replies, done=False, info={"metrics": self._counts(episode, counts)}
        )

    async def score(self, state: EnvState) -> Score:
        episode: _Episode = state.data["episode"]
        done = episode.program.done
        finished = done.done() and not done.cancelled() and done.exception() is None
        outcome = HarnessOutcome(
            state.example, list(episode.session.api), done.result() if finished else None, finished
        )
        if self.reward is not None:
            return await call(self.reward, outcome)
        return _reported(outcome.result)

    def cleanup(self, state: EnvState) -> None:
        episode: _Episode | None = state.data.get("episode")
        if episode is None:
            return
        episode.program.kill()
        self.server.close_session(episode.session, "the episode is over")

    def state_dict(self, state: EnvState) -> dict[str, Any]:
        raise TypeError(
            "a harness episode holds a running program and cannot be checkpointed; an "
            "interrupted one restarts from its prompt"
        )

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        if self.examples is None:
            return super().dataset(n, seed)
        if callable(self.examples):
            return list(self.examples(n, seed))
        rows = list(self.examples)
        return [{"id": i, **rows[i % len(rows)]} for i in range(n)] if rows else []

    # -- helpers -----------------------------------------------------------------------------
    def _rendered(self, episode: _Episode, request: ChatRequest) -> list[Message]:
        """A request's whole conversation as the chat template renders it."""
        return rendered(
            request.messages,
            request.tools,
            self.parser,
            self.tools_in_prompt,
            lambda given: self._call_id(episode, given),
        )

    def _answer_id(self, episode: _Episode, given: str | None) -> str:
        """The id an answer gives a call the model wrote (``given``: the id it wrote):
        never one the episode gave before (a model copies ids from its context), in the
        format's form (Mistral's templates check it), the model's own where that holds;
        a format without a form of its own gets ``call_<episode>_<n>``, unique across
        episodes too (clients may key calls by id)."""
        if given is None and getattr(self.parser, "call_id", None) is None:
            given = f"call_{episode.tag}_{len(episode.issued) + 1}"
        return parsers.new_call_id(self.parser, episode.issued, given)

    def _call_id(
        self, episode: _Episode, given: str | None, echoed: dict[str, str] | None = None
    ) -> str:
        """The id of a call (or of the call a tool result answers) in a client's history,
        as the template renders it: the id it was answered with (``echoed``: a client may
        rewrite ids), kept where the format takes it, else a new one in the format's form
        (``loomrl.parsers.call_id``; Mistral's templates check it)."""
        given = (echoed or {}).get(given or "", given)
        if given and parsers.call_id(self.parser, 1, given) == given:
            return given
        return parsers.new_call_id(self.parser, episode.issued)

    async def _next(self, episode: _Episode) -> ChatRequest | None:
        """The program's next request; None when it ended; its failure or the episode's
        timeout raise (the program is killed on the way out)."""
        left = episode.deadline - asyncio.get_running_loop().time()
        program = episode.program
        try:
            async with asyncio.timeout(max(left, 0.0)) as deadline:
                request = await episode.session.next_request(program.done)
        except TimeoutError:
            if not deadline.expired():
                raise
            program.kill()
            raise EnvTimeout(f"the harness ran past its timeout={self.timeout:g}s") from None
        episode.request = request
        if request is None:
            problem = _failure(program)
            if problem:
                raise HarnessError(problem)
        return request

    def _answer(self, message: Message, turn: TurnRecord | None, request: ChatRequest) -> Answer:
        """The answer to ``request``; ``turn`` is None when the episode is driven without
        the turn loop (``advance``), which knows no tokens: usage and logprobs are 0."""
        turn = turn or TurnRecord([], [], "stop", 0)
        if message.get("tool_calls"):
            finish = "tool_calls"
        else:
            finish = "length" if turn.finish_reason == "length" else "stop"
        logprobs = None
        if request.logprobs:  # tokens named by id, as vLLM's return_tokens_as_token_ids
            logprobs = [
                {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(turn.token_ids, turn.logprobs, strict=True)
            ]
        return Answer(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            model=self.model,
            message=message,
            finish_reason=finish,
            prompt_tokens=turn.context_tokens,
            completion_tokens=len(turn.token_ids),
            logprobs=logprobs,
        )

    @staticmethod
    def _counts(episode: _Episode, counts: dict[str, float]) -> dict[str, float]:
        """This step's counts plus the session's request counts since the last step."""
        for key in ("requests", "bad_requests", "resends"):
            total = episode.session.counts[key]
            counts[f"harness/{key}"] = total - episode.reported.get(key, 0)
            episode.reported[key] = total
        return counts


def _failure(program: Program) -> str | None:
    """Why the finished program failed, or None when it ended well."""
    done = program.done
    if done.cancelled():
        return "the harness was cancelled"
    exc = done.exception()
    if exc is not None:
        return f"the harness raised {type(exc).__name__}: {exc}"
    result = done.result()
    if isinstance(result, ProgramExit) and result.returncode != 0:
        tail = result.stderr.strip()[-800:]
        return f"the harness command exited with code {result.returncode}" + (
            f": {tail}" if tail else ""
        )
    return None


def _reported(result: Any) -> Score:
    """The reward the program reported: a number, ``{"reward": x}``, or components."""
    if isinstance(result, ProgramExit):
        result = result.reported()
    if isinstance(result, dict) and "reward" in result:
        result = result["reward"]
    if isinstance(result, bool) or not isinstance(result, int | float | dict):
        raise ValueError(
            "the harness reported no reward and the env has no reward function: return a "
            "number or {'reward': x} (a command prints it as its last stdout line), or "
            f"pass reward=; got {result!r:.80}"
        )
    split_score(result)  # checks the values are finite numbers
    return result


def _resolve(value: Any, what: str) -> Any:
    """``"module:attribute"`` imported (so TOML and the CLI can name code), else as is."""
    if not isinstance(value, str):
        return value
    module, _, attribute = value.partition(":")
    if not module or not attribute:
        raise ValueError(f"{what} must be 'module:attribute', got {value!r}")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what} {value!r} cannot be imported: {exc}") from None
