"""``RewardConfig`` -> a weighted ``Recipe`` (``build_reward``), and the checks a command
runs before any engine starts (``check_reward``).

``check_reward`` starts nothing: it knows every function name (a near miss gets a
"did you mean"), binds each function's arguments, finds the reward model (a known spec
or a directory holding a sequence classifier), connects to the remote server and the
judge's server with a short timeout, and reads the judge's template. Each problem is one
line (``ValueError``) naming the config key.

``build_reward`` builds every source: reward functions, the reward model (loaded now),
the remote client and the judge with its own engine (``loomrl.engines.load``: vLLM in
process for a model spec, a ``RemoteEngine`` for a URL). ``BuiltReward.close`` closes the
judge's engine: call it when the run ends.
"""

from __future__ import annotations

import difflib
import inspect
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loomrl.engines.base import Engine
from loomrl.redact import redact_url
from loomrl.rewards import funcs
from loomrl.rewards.base import RewardSource, per_sample
from loomrl.rewards.config import JudgeConfig, ModelRewardConfig, RewardConfig
from loomrl.rewards.judge import DEFAULT_TEMPLATE, Judge, template_problem
from loomrl.rewards.recipe import Recipe
from loomrl.rewards.remote import RemoteReward
from loomrl.types import SamplingParams

CONNECT_TIMEOUT_S = 3.0
JudgeEngineMaker = Callable[[JudgeConfig], Engine]


@dataclass
class BuiltReward:
    """The run's reward: the ``Recipe`` and the engines it opened (a judge's)."""

    scorer: Recipe
    engines: list[Engine] = field(default_factory=list)

    async def close(self) -> None:
        """Close the engines the reward opened (idempotent)."""
        engines, self.engines = self.engines, []
        for engine in engines:
            await engine.close()


def check_reward(config: RewardConfig, where: str = "reward") -> None:
    """Every problem ``build_reward`` would meet, found without starting an engine
    (module docstring); a ``ValueError`` of one line naming the key under ``where``."""
    for i, term in enumerate(config.rubric):
        _function(term.fn, term.args, f"{where}.rubric[{i}]")
    if config.model is not None:
        model_dir(config.model, f"{where}.model")
    if config.remote is not None:
        what = f"{where}.remote"
        try:
            _remote(config.remote.model_dump())  # the URL's form and the token's variable
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        reachable(config.remote.url, what)
    if config.judge is not None:
        _check_judge(config.judge, f"{where}.judge")


def build_reward(
    config: RewardConfig, *, judge_engine: JudgeEngineMaker | None = None
) -> BuiltReward:
    """The config's sources as one ``Recipe`` (label ``default``) with their weights;
    ``judge_engine`` builds the judge's engine (default: ``open_judge_engine``)."""
    sources: dict[str, RewardSource] = {}
    weights: list[tuple[str, float]] = []
    for i, term in enumerate(config.rubric):
        _function(term.fn, term.args, f"reward.rubric[{i}]")
        fn = funcs.make(term.fn, **term.args)
        sources[term.component] = per_sample(fn, term.component)
        weights.append((term.component, term.weight))
    if config.model is not None:
        sources[config.model.name] = _reward_model(config.model)
        weights.append((config.model.name, config.model.weight))
    if config.remote is not None:
        sources[config.remote.name] = _remote(config.remote.model_dump())
        weights.append((config.remote.name, config.remote.weight))
    engines: list[Engine] = []
    if config.judge is not None:  # last: nothing can fail once its engine is open
        judge = config.judge
        _check_judge(judge, "reward.judge", connect=False)
        engine = (judge_engine or open_judge_engine)(judge)
        engines.append(engine)
        sources[judge.name] = Judge(
            engine, None, template=judge.prompt or DEFAULT_TEMPLATE, system=judge.system,
            low=judge.low, high=judge.high, reference_key=judge.reference_key,
            sampling=SamplingParams(max_tokens=judge.max_tokens, temperature=0.0),
            on_parse_error=judge.on_parse_error, fallback=judge.fallback,
        )  # fmt: skip
        weights.append((judge.name, judge.weight))
    return BuiltReward(Recipe({"default": weights}, sources=sources), engines)


def open_judge_engine(config: JudgeConfig) -> Engine:
    """The judge's engine: a ``RemoteEngine`` for a URL, else vLLM serving the spec."""
    from loomrl import engines

    if is_url(config.engine):
        return engines.load(config.engine, model=config.tokenizer)
    return engines.load(f"vllm:{config.engine}")


def model_dir(config: ModelRewardConfig, what: str = "reward.model") -> Path | None:
    """Check the reward model: a known model spec (returns None: it is built on first use)
    or a directory holding a sequence classifier (returned)."""
    from loomrl.models import NAMED, ModelError, check_spec

    spec = config.path
    if spec in NAMED or (":" in spec and spec.split(":", 1)[0] in NAMED):
        try:
            check_spec(spec)
        except (ModelError, FileNotFoundError) as exc:
            raise ValueError(f"{what}: {exc}") from None
        return None
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"{what}: {spec!r} is neither a model spec ({', '.join(NAMED)}) nor a local "
            "directory (reward models are never downloaded)"
        )
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        raise ValueError(f"{what}: {spec!r} has no readable config.json") from None
    if not any("ForSequenceClassification" in a for a in architectures or []):
        raise ValueError(
            f"{what}: {spec!r} is not a sequence-classification model (architectures: "
            f"{architectures}); a reward model has a score head (e.g. "
            "AutoModelForSequenceClassification with num_labels=1)"
        )
    return path


def reachable(url: str, what: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to ``url``'s host; a one-line ValueError when
    none opens within ``timeout_s``."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=timeout_s).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ValueError(
            f"{what}: cannot reach {redact_url(url)} ({reason}; waited up to {timeout_s:g}s)"
        ) from None


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _function(name: str, args: dict[str, Any], what: str) -> None:
    if name not in funcs.FUNCTIONS:
        near = difflib.get_close_matches(name, list(funcs.FUNCTIONS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(
            f"{what}: unknown reward function {name!r}{hint}; known: "
            f"{', '.join(sorted(funcs.FUNCTIONS))}"
        )
    try:
        inspect.signature(funcs.FUNCTIONS[name]).bind(**args)
    except TypeError:
        takes = ", ".join(funcs.function_args(name)) or "no arguments"
        raise ValueError(
            f"{what}: reward function {name!r} takes {takes}; got {', '.join(args)}"
        ) from None
    try:
        funcs.make(name, **args)
    except (ValueError, TypeError, ImportError) as exc:
        raise ValueError(f"{what}: {name}: {exc}") from None


def _check_judge(config: JudgeConfig, what: str, *, connect: bool = True) -> None:
    from loomrl.models import ModelError, check_spec

    problem = template_problem(config.prompt) if config.prompt is not None else None
    if problem is not None:
        raise ValueError(f"{what}.prompt: {problem}")
    if not config.low < config.high:
        raise ValueError(f"{what}: need low < high, got low={config.low}, high={config.high}")
    specs = [("engine", config.engine)] if not is_url(config.engine) else []
    specs += [("tokenizer", config.tokenizer)] if config.tokenizer is not None else []
    for key, spec in specs if connect else []:
        try:
            check_spec(spec)
        except (ModelError, FileNotFoundError) as exc:
            raise ValueError(f"{what}.{key}: {exc}") from None
    if connect and is_url(config.engine):
        reachable(config.engine, f"{what}.engine")


def _reward_model(config: ModelRewardConfig) -> RewardSource:
    from loomrl.models import resolve
    from loomrl.rewards.model import RewardModel

    path = model_dir(config) or resolve(config.path)
    return RewardModel(
        path, input=config.input, batch_size=config.batch_size, device=config.device,
        max_length=config.max_length, label_index=config.label_index,
    )  # fmt: skip


def _remote(settings: dict[str, Any]) -> RemoteReward:
    kwargs = {k: v for k, v in settings.items() if k not in ("weight", "name")}
    return RemoteReward(kwargs.pop("url"), **kwargs)
