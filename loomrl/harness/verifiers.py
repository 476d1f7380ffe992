"""``verifiers:TASKSET``: a verifiers 0.4 (``verifiers.v1``) taskset played as a harness episode.

Each episode runs verifiers' own ``env.run_episode(task, ctx)`` (inside ``env.serving()``,
which starts its interception server and the taskset's tool servers) with the model
endpoint pointed at the episode's loomrl session, so every model turn is sampled by the
rollout's engine and kept token-exact (``loomrl.harness.env``). Rewards are the ones
verifiers computed for the trace (its ``@vf.reward`` functions), each component
``score * weight`` under its own name; its ``@vf.metric`` values become env metrics
``verifiers/NAME``. A trace that failed (errors, or a stop condition such as
``sandbox_error``) makes the episode an error rather than a silent zero.

Agents run verifiers' ``null`` harness (a chat loop with the taskset's MCP tools) in the
``subprocess`` runtime unless the taskset ships a harness of its own or ``harness`` /
``config`` say otherwise. That harness is a PEP 723 script verifiers prepares with ``uv``
(cached under ``~/.cache/uv`` and ``~/.cache/verifiers``): ``uv`` must be on PATH, so the
running interpreter's scripts directory is appended when it holds one. Tool servers run
as ``python -m TASKSET``, so the taskset's directory is added to PYTHONPATH.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path
from typing import Any

from loomrl.envs.base import EnvState, EnvStep, Message, Score
from loomrl.harness.env import HarnessEnv, HarnessOutcome
from loomrl.harness.program import HarnessRun

API_KEY_VAR = "LOOMRL_VERIFIERS_API_KEY"
"""verifiers reads the endpoint's key from this variable; the session URL is the key."""
DEFAULT_HARNESS = "null"


class MissingVerifiers(ImportError, ValueError):
    """verifiers is not installed (also a ``ValueError``: the CLI reports it as bad input)."""


class VerifiersEpisodeError(RuntimeError):
    """verifiers reported the episode as failed; the message names its errors."""


def _vf() -> Any:
    """``verifiers.v1``, imported on first use (a few seconds)."""
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise MissingVerifiers(
            f"verifiers environments need verifiers>=0.4 ({exc}): pip install 'loomrl[verifiers]'"
        ) from None
    return vf


class VerifiersEnv(HarnessEnv):
    """Episodes of the verifiers taskset ``taskset`` (an importable module name, as
    verifiers' ``--env.taskset.id``). ``config`` is merged (deeply) into the env config
    verifiers resolves, e.g. ``{"player": {"max_turns": 4}}`` or ``{"taskset": {...}}``;
    ``max_turns`` caps every agent's turns there and loomrl's turns alike; ``harness``
    names the agents' verifiers harness. Examples are ``{"id": i, "task": k}``, cycling
    over the taskset's tasks in order."""

    name = "verifiers"

    def __init__(
        self,
        taskset: str,
        *,
        config: dict[str, Any] | None = None,
        harness: str | None = None,
        max_turns: int | None = None,
        timeout: float = 600.0,
        parser: str = "hermes",
        tools_in_prompt: bool = True,
        model: str = "loomrl",
    ) -> None:
        vf = _vf()
        check(taskset)
        super().__init__(
            self._play,
            reward=self._reward,
            parser=parser,
            tools_in_prompt=tools_in_prompt,
            timeout=timeout,
            max_turns=max_turns,
            model=model,
        )
        self.taskset = taskset
        roles = [
            name
            for name, field in vf.env_config_type(taskset).model_fields.items()
            if isinstance(field.default, vf.AgentConfig)
        ]
        agent: dict[str, Any] = {
            "harness": {"id": harness or _default_harness(vf, taskset)},
            "runtime": {"type": "subprocess"},  # verifiers' default is a remote sandbox
        }
        if max_turns is not None:
            agent["max_turns"] = max_turns
        raw: dict[str, Any] = {"taskset": {"id": taskset}}
        raw.update({role: copy.deepcopy(agent) for role in roles})
        self.vf_config = vf.resolve_env_config(_merged(raw, config or {}))
        self._template = vf.load_environment(self.vf_config)  # checks roles and harnesses
        self._tasks: list[Any] | None = None
        _prepare_processes(taskset)

    # -- examples and tasks ----------------------------------------------------------------
    def tasks(self) -> list[Any] | None:
        """The taskset's tasks, loaded once; None for an infinite taskset."""
        taskset = self._template.taskset
        if self._tasks is None and taskset.bounded:
            self._tasks = list(taskset)
            if not self._tasks:
                raise ValueError(f"verifiers taskset {self.taskset!r} has no tasks")
        return self._tasks

    def dataset(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """The tasks in taskset order, cycled (``seed`` changes nothing: the taskset is
        the data, as a ``HarnessEnv``'s example list is)."""
        tasks = self.tasks()
        count = n if tasks is None else len(tasks)
        return [{"id": i, "task": i % count} for i in range(n)]

    def _task(self, index: int) -> Any:
        tasks = self.tasks()
        if tasks is not None:
            return tasks[index]
        return next(iter(self._template.taskset.skip(index).take(1)))

    # -- the episode -----------------------------------------------------------------------
    async def _play(self, run: HarnessRun) -> Any:
        """verifiers' own episode, its model calls answered by this episode's session. A
        fresh ``Env`` per episode: ``serving()`` keeps its servers on the env object."""
        vf = _vf()
        env = vf.load_environment(self.vf_config)
        task = self._task(int(run.example["task"]))
        client = vf.EvalClientConfig(base_url=run.base_url, api_key_var=API_KEY_VAR)
        ctx = vf.ModelContext(model=run.model, client=client)
        async with env.serving():
            return await env.run_episode(task, ctx)

    async def step(self, state: EnvState, message: Message) -> EnvStep:
        result = await super().step(state, message)
        if result.done:  # the program ended well: verifiers' metrics go with the last step
            episode = state.data["episode"].program.done.result()
            metrics = result.info.setdefault("metrics", {})
            for trace in episode.traces:
                for name, value in trace.metrics.items():
                    if value is not None:
                        key = f"verifiers/{name}"
                        metrics[key] = metrics.get(key, 0.0) + float(value)
        return result

    @staticmethod
    def _reward(outcome: HarnessOutcome) -> Score:
        """verifiers' reward components (``score * weight``); 0 for an episode loomrl cut
        off (turn or length limit) before verifiers scored it."""
        episode = outcome.result
        if not outcome.finished or episode is None:
            return 0.0
        problem = _failure(episode)
        if problem:
            raise VerifiersEpisodeError(problem)
        components: dict[str, float] = {}
        several = len(episode.traces) > 1
        for trace in episode.traces:
            for name, reward in trace.rewards.items():
                key = f"{trace.agent.name}/{name}" if several else name
                components[key] = components.get(key, 0.0) + reward.score * reward.weight
        return components or 0.0


def verifiers_env(
    member: str,
    config: dict[str, Any] | None = None,
    harness: str | None = None,
    max_turns: int | None = None,
    timeout: float = 600.0,
) -> VerifiersEnv:
    """The ``verifiers`` family's factory: ``load("verifiers:MODULE", **kwargs)``."""
    return VerifiersEnv(
        member, config=config, harness=harness, max_turns=max_turns, timeout=timeout
    )


def check(member: str) -> None:
    """Raise ``ValueError`` unless ``member`` names an importable taskset module (an
    installed package, a module on PYTHONPATH or a verifiers built-in); cheap: nothing
    is imported but verifiers itself, and that only for a built-in."""
    if importlib.util.find_spec("verifiers") is None:
        _vf()  # raises MissingVerifiers
    name = _module_name(member)
    if _found(name) or _found(f"verifiers.v1.tasksets.{name}"):
        return
    raise ValueError(
        f"no verifiers taskset {member!r}: module {name!r} is not importable (install the "
        "taskset's package, or put its directory on PYTHONPATH)"
    )


def _module_name(member: str) -> str:
    """The module verifiers imports for a taskset id (``owner/name@version`` -> ``name``)."""
    return member.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, an odd name
        return False


def _default_harness(vf: Any, taskset: str) -> str:
    """The taskset's own harness when it ships one, else the tool-less chat loop (not
    verifiers' usual ``bash``, which runs the model's shell commands)."""
    own = vf.default_harness_id(taskset)
    return DEFAULT_HARNESS if own == "bash" else own


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _failure(episode: Any) -> str | None:
    """What went wrong in a verifiers episode, or None when it and its traces are ok."""
    problems = [f"{e.type}: {e.message[:400]}" for e in episode.errors]
    for trace in episode.traces:
        unscored = [name for name, reward in trace.rewards.items() if reward is None]
        if trace.ok and not trace.errors and not unscored:
            continue
        errors = "; ".join(f"{e.type}: {e.message[:400]}" for e in trace.errors) or "none"
        problems.append(
            f"trace of {trace.agent.name!r} stopped with stop_condition="
            f"{trace.stop_condition!r}, errors: {errors}"
            + (f", unscored rewards {unscored}" if unscored else "")
        )
    if not problems and not episode.ok:
        problems.append("episode.ok is False")
    return "the verifiers episode failed: " + " | ".join(problems) if problems else None


def _prepare_processes(taskset: str) -> None:
    """What verifiers' subprocesses need from the environment, set once per process: an
    API key variable (any value: the session URL names the session), ``uv`` on PATH, and
    the taskset's directory on PYTHONPATH (tool servers import it)."""
    os.environ.setdefault(API_KEY_VAR, "loomrl")
    scripts = sysconfig.get_path("scripts")
    if shutil.which("uv") is None and scripts and Path(scripts, "uv").exists():
        os.environ["PATH"] = os.pathsep.join(filter(None, [os.environ.get("PATH"), scripts]))
    spec = importlib.util.find_spec(_module_name(taskset))
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return
    root = Path(spec.origin).parent
    if spec.submodule_search_locations is not None:  # a package: its __init__.py
        root = root.parent
    for _ in range(spec.name.count(".")):
        root = root.parent
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    site = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    if str(root) not in paths and str(root) not in site:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, str(root)])
