"""``python_tool``: math word problems solved with a sandboxed Python interpreter.

The model may call ``python(code)`` as often as it likes; each episode has its own
interpreter (``loomrl.sandbox``), started on its first call, keeping variables between
calls like a notebook, and killed when the episode is over (``cleanup``). The final
reply (no tool call) is scored on its ``Answer: N`` line: 1.0 when exact. Optional
``format_weight`` and ``tool_weight`` add components for using the answer line and for
running code at least once. ``few_shot`` opens each episode with one solved example
(a call, its output, the answer): small models copy the call format from it, not from
the system prompt. Examples come from the built-in word problems
(``loomrl.envs.word_problems``) or a data file of ``question`` / ``answer`` rows.
"""

from __future__ import annotations

import asyncio
import json
import random
import weakref
from dataclasses import dataclass, field
from typing import Any

from loomrl.answers.parse import FORMAT_HINT, answer_line, extract_answer, same_number
from loomrl.envs.base import EnvState, EnvStep, Score, make_dataset
from loomrl.envs.tools import ToolEnv, ToolResult
from loomrl.envs.word_problems import KINDS, check_kinds, word_problem
from loomrl.sandbox import Sandbox, SandboxConfig

NO_OUTPUT = "(no output: print() what you want to see)"
RESUMED = "[a new Python interpreter was started: earlier variables are gone]"
DEMO_CODE = "print(sum(int(d) for d in str(2**15)))"
DEMO: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the sum of the digits of 2 to the power 15?"},
    {
        "role": "assistant",
        "content": "<tool_call>\n"
        + json.dumps({"name": "python", "arguments": {"code": DEMO_CODE}})
        + "\n</tool_call>",
    },
    {"role": "tool", "name": "python", "content": "26"},
    {"role": "assistant", "content": "2**15 = 32768, whose digits add up to 26.\nAnswer: 26"},
]


@dataclass
class _Episode:
    """One episode's interpreter: started on first use; its lock orders the calls."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: Any = None


class PythonToolEnv(ToolEnv):
    """Word problems with a ``python`` tool running in a per-episode sandbox."""

    name = "python_tool"
    nonblocking = True  # reset and score are microseconds; the tool itself is async
    max_turns = 5
    max_obs_tokens = 512
    system_prompt = (
        "Solve the problem. You can run Python code with the python tool: it keeps "
        "variables between calls, and you see what the code prints. When you know the "
        f"result, reply without a tool call. {FORMAT_HINT}"
    )

    def __init__(
        self,
        kinds: list[str] | None = None,
        sandbox: dict[str, Any] | None = None,
        format_weight: float = 0.0,
        tool_weight: float = 0.0,
        few_shot: bool = False,
        **tool_env: Any,
    ) -> None:
        self.kinds = check_kinds(kinds or list(KINDS))
        self.sandbox_config = SandboxConfig(**(sandbox or {}))
        if format_weight < 0 or tool_weight < 0:
            raise ValueError("format_weight and tool_weight must be >= 0")
        self.format_weight, self.tool_weight = format_weight, tool_weight
        # The host-side deadline is the sandbox's own wall time; this one only backs it.
        tool_env.setdefault("tool_timeout", self.sandbox_config.wall_s + 10.0)
        if few_shot:  # the demo is a Hermes call, whatever the template would choose
            tool_env.setdefault("parser", "hermes")
            if tool_env["parser"] != "hermes":
                raise ValueError("few_shot shows a Hermes tool call: use it with parser='hermes'")
        super().__init__([self.python], **tool_env)
        self.few_shot = few_shot
        self.sandbox = Sandbox(self.sandbox_config)  # decides (and warns about) isolation now
        self._episodes: dict[int, _Episode] = {}

    async def step(self, state: EnvState, message: dict[str, Any]) -> EnvStep:
        result = await super().step(state, message)
        result.info["metrics"].setdefault("sandbox_s", 0.0)  # reported even without calls
        return result

    def reset(self, example: dict[str, Any]) -> EnvState:
        state = super().reset(example)
        if self.few_shot:  # the solved example goes just before the question
            at = len(state.messages) - 1
            state.messages[at:at] = [dict(m) for m in DEMO]
        state.data["opening"] = len(state.messages)  # what the episode itself said follows
        return state

    def run_info(self) -> dict[str, Any]:
        return {**super().run_info(), "sandbox": self.sandbox.mode}

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        def one(rng: random.Random) -> dict[str, Any]:
            return word_problem(rng, self.kinds)

        return make_dataset(n, seed, one)

    async def python(self, code: str, state: EnvState) -> ToolResult:
        """Run Python code in your own interpreter and see what it prints.

        Variables, functions and imports persist between calls. There is no network and
        no access to files outside a private temporary directory.

        Args:
            code: Python source code; print() the values you want to see.
        """
        episode = self._episode(state)
        async with episode.lock:
            lost = False
            if episode.session is None:
                episode.session = await self.sandbox.session()
                # Calls made before (a resumed episode): their variables are gone.
                lost = state.data.get("python_calls", 0) > 0
            result = await episode.session.run(code)
            state.data["python_calls"] = state.data.get("python_calls", 0) + 1
        text = result.text or NO_OUTPUT
        if lost:
            text = f"{RESUMED}\n{text}"
        kind = None
        if result.timed_out:
            kind = "timeout"
        elif result.error is not None:
            kind = "execution"
        return ToolResult(text, kind, {"sandbox_s": result.duration_s})

    def _episode(self, state: EnvState) -> _Episode:
        key = id(state)
        episode = self._episodes.get(key)
        if episode is None:
            episode = self._episodes[key] = _Episode()
            # A state dropped without cleanup (a caller outside the rollout loop) still
            # frees its interpreter when it is garbage-collected.
            weakref.finalize(state, self._close, key)
        return episode

    def cleanup(self, state: EnvState) -> None:
        self._close(id(state))

    def _close(self, key: int) -> None:
        episode = self._episodes.pop(key, None)
        if episode is not None and episode.session is not None:
            episode.session.close()

    def score(self, state: EnvState) -> Score:
        final = self.final_answer(state)
        correct = 0.0
        if final is not None:
            correct = float(same_number(extract_answer(final).value, state.example["answer"]))
        if not (self.format_weight or self.tool_weight):
            return correct
        parts = {"correct": correct}
        if self.format_weight:
            formatted = final is not None and answer_line(final) is not None
            parts["format"] = self.format_weight * formatted
        if self.tool_weight:
            played = state.messages[state.data.get("opening", 0) :]
            ran = any(m.get("role") == "tool" for m in played)
            parts["tool_use"] = self.tool_weight * ran
        return parts
