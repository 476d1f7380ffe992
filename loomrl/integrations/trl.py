"""loomrl rollouts as TRL's ``GRPOTrainer(rollout_func=...)``; see docs/trl.md.

TRL's contract (checked against trl 1.16.0, ``GRPOTrainer._generate``): TRL calls
``rollout_func(prompts, trainer)`` synchronously with this process's slice of the
generation batch. The slice already holds every prompt ``num_generations`` times in a row
(TRL's ``RepeatSampler``), so this module plays **one** trajectory per prompt, in order.
The returned dict needs ``prompt_ids``, ``completion_ids`` and ``logprobs`` (one list per
prompt); ``env_mask`` (1 = model token, 0 = environment token) is popped by TRL and
multiplied into its loss mask; every other key is given, row by row, to the reward
functions as a keyword argument. Here those are ``reward`` (the environment's score, or
``None`` when the trajectory was not scored: TRL then gives it zero advantage),
``reward_components`` and ``status``; ``passthrough_reward`` returns ``reward``.

TRL calls us from plain synchronous code, but an engine may be bound to one event loop
(vLLM's ``AsyncLLM`` starts its output-handler tasks on the loop that first uses it, and
they die with that loop, so ``asyncio.run`` per call would kill it after the first step).
``TRLRollout`` therefore owns one event loop on a daemon thread and runs every rollout,
engine construction and weight sync there. Importing this module does not import TRL.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from loomrl.engines.base import Engine
from loomrl.envs import load as load_env
from loomrl.envs.base import Environment
from loomrl.episode.scoring import SCORED
from loomrl.rollout import Rollouts, rollout
from loomrl.tokens import ChatTokenizer
from loomrl.types import SamplingParams, Trajectory

__all__ = ["TRLRollout", "component_reward", "passthrough_reward", "prompt_example", "rollout_func"]

Prompt = str | list[dict[str, Any]]
EngineSource = Engine | str | Callable[[], Engine]
T = TypeVar("T")


def prompt_example(prompt: Prompt) -> dict[str, Any]:
    """The default ``to_example``: a TRL prompt as a loomrl example.

    A standard prompt (a string) gives ``{"question": prompt}``. A conversational one (a
    list of messages) gives ``{"question": <text of its last user message>, "prompt":
    messages}``; the environment's ``reset`` builds the conversation it plays (its own
    system prompt, the question), so the dataset's other messages reach only an env that
    reads ``example["prompt"]``.
    """
    if isinstance(prompt, str):
        return {"question": prompt}
    users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise ValueError(f"conversational prompt has no user message: {prompt!r}")
    content = users[-1].get("content", "")
    if not isinstance(content, str):  # typed content blocks: keep the text parts
        content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return {"question": content, "prompt": prompt}


class TRLRollout:
    """A callable with TRL's ``rollout_func`` signature; build it with ``rollout_func``.

    ``last`` holds the ``Rollouts`` (trajectories and metrics) of the latest call.
    ``run(coro)`` runs a coroutine on the owned loop (e.g. your own weight sync).
    ``close()`` closes an engine built here from a spec or factory and stops the loop.
    """

    def __init__(
        self,
        env: Environment | str,
        engine: EngineSource,
        *,
        sampling: SamplingParams | None = None,
        max_turns: int | None = None,
        max_len: int | None = None,
        chat: ChatTokenizer | None = None,
        to_example: Callable[[Prompt], dict[str, Any]] = prompt_example,
        concurrency: int = 256,
        on_error: Literal["raise", "isolate"] = "raise",
        env_timeout: float | None = None,
        sync_weights: bool = True,
    ) -> None:
        self.env = load_env(env) if isinstance(env, str) else env
        self.sampling = sampling or SamplingParams()
        self.to_example = to_example
        self.sync_weights = sync_weights
        self.last: Rollouts | None = None
        self._options: dict[str, Any] = dict(
            max_turns=max_turns, max_len=max_len, concurrency=concurrency,
            on_error=on_error, env_timeout=env_timeout,
        )  # fmt: skip
        self._groups = 0  # running group id: distinct sampling seeds across calls
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="loomrl-trl-loop", daemon=True
        )
        self._thread.start()
        self._owns_engine = not _is_engine(engine)
        try:
            self.engine: Engine = self.run(_build(engine))
            if sync_weights and not hasattr(self.engine, "update_weights"):
                raise TypeError(
                    f"{type(self.engine).__name__} has no update_weights; pass "
                    "sync_weights=False and keep its weights in step yourself"
                )
            self.chat = chat or ChatTokenizer(self.engine.tokenizer)  # type: ignore[attr-defined]
        except BaseException:
            self.close()
            raise

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the owned event loop and return its result (blocking)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("TRLRollout.run called from its own event loop (would deadlock)")
        if self._loop.is_closed():
            raise RuntimeError("TRLRollout is closed")

        async def wrap() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result()

    def __call__(self, prompts: Sequence[Prompt], trainer: Any = None, *_: Any) -> dict[str, list]:
        """TRL's ``rollout_func(prompts, trainer)``: one trajectory per prompt, in order.

        A second argument without ``.state`` (older TRL passed ``args, processing_class``)
        is ignored: no weight sync, no temperature check.
        """
        if hasattr(trainer, "state"):
            self._check_temperature(trainer)
            if self.sync_weights:
                self._sync(trainer)
        examples = [self.to_example(p) for p in prompts]
        first, self._groups = self._groups, self._groups + len(examples)
        self.last = self.run(
            rollout(
                self.engine, self.env, examples, n=1, sampling=self.sampling, chat=self.chat,
                first_group_id=first, **self._options,
            )
        )  # fmt: skip
        return to_trl(self.last, self._filler_id())

    def close(self) -> None:
        """Close an engine built here, then stop and close the owned loop (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            engine = getattr(self, "engine", None)
            if self._owns_engine and engine is not None:
                self.run(engine.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> TRLRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sync(self, trainer: Any) -> None:
        """Push the trainer's weights when the engine's version is not the trainer's step.

        ``policy_version`` of the engine is the number of optimizer steps its weights
        have seen, so a fresh engine (version 0) at step 0 is not synced, and a resumed
        run is synced before its first rollout.
        """
        step = int(trainer.state.global_step)
        if self.engine.policy_version == step:
            return
        accelerator = getattr(trainer, "accelerator", None)
        model = accelerator.unwrap_model(trainer.model) if accelerator else trainer.model
        if getattr(model, "peft_config", None):
            raise NotImplementedError(
                "weight sync of PEFT models is not supported; pass sync_weights=False and "
                "push merged weights with TRLRollout.run(engine.update_weights(...))"
            )
        self.run(self.engine.update_weights(model.state_dict(), version=step))  # type: ignore[attr-defined]

    def _check_temperature(self, trainer: Any) -> None:
        wanted = getattr(getattr(trainer, "args", None), "temperature", None)
        if wanted is not None and wanted != self.sampling.temperature:
            warnings.warn(
                f"GRPOConfig.temperature={wanted} but loomrl samples at temperature="
                f"{self.sampling.temperature}; TRL scores tokens at its own temperature, "
                "so set both to the same value",
                stacklevel=3,
            )

    def _filler_id(self) -> int:
        tokenizer = self.chat.tokenizer
        for token in (tokenizer.eos_token_id, tokenizer.pad_token_id):
            if token is not None:
                return int(token)
        return 0


def rollout_func(env: Environment | str, engine: EngineSource, **options: Any) -> TRLRollout:
    """A ``rollout_func`` for ``GRPOTrainer`` playing ``env`` with a loomrl ``engine``.

    ``engine`` is an engine, an engine spec (``"vllm:MODEL"``) or a zero-argument factory;
    a spec or factory is built on the owned event loop and closed by ``close()``. An
    engine object must not yet be bound to another running loop. ``options`` are
    ``TRLRollout``'s keywords: ``to_example`` maps each TRL prompt to the example
    ``env.reset`` receives (TRL passes only the prompt column; other dataset columns
    reach reward functions, not the rollout). With ``sync_weights`` (default) the
    trainer's model weights are pushed into the engine (``engine.update_weights``)
    whenever ``engine.policy_version`` differs from ``trainer.state.global_step``.
    ``sampling``, ``max_turns``, ``max_len``, ``chat``, ``concurrency``, ``on_error`` and
    ``env_timeout`` are ``loomrl.rollout``'s.
    """
    return TRLRollout(env, engine, **options)


def to_trl(trajs: Sequence[Trajectory], filler_id: int) -> dict[str, list]:
    """Trajectories as TRL's rollout output, one row per trajectory in order.

    A trajectory that never got a prompt or a completion token (an env timeout or an
    isolated error in ``reset``) gets one ``filler_id`` token there, with ``env_mask`` 0,
    so TRL can build its batch; its ``reward`` is ``None``, so it adds nothing to the loss.
    """
    out: dict[str, list] = {
        key: []
        for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "reward",
                    "reward_components", "status")
    }  # fmt: skip
    for traj in trajs:
        if traj.segments:
            raise ValueError(
                f"example {traj.example_id} (sample {traj.sample_index}) is a forked episode "
                f"of {len(traj.segments) + 1} segments (its harness rewrote its history); "
                "TRL takes one completion per prompt: train forked episodes with loomrl train"
            )
        if traj.images:
            raise ValueError(
                f"example {traj.example_id} (sample {traj.sample_index}) shows "
                f"{len(traj.images)} images; TRL's rollout output carries token ids only, "
                "so its trainer would score them without the pictures: train vision-language "
                "episodes with loomrl train"
            )
        scored = traj.status in SCORED
        completion = traj.completion_ids or [filler_id]
        out["prompt_ids"].append(list(traj.prompt_ids) or [filler_id])
        out["completion_ids"].append(list(completion))
        out["logprobs"].append(list(traj.logprobs) if traj.completion_ids else [0.0])
        out["env_mask"].append(list(traj.loss_mask) if traj.completion_ids else [0])
        out["reward"].append(traj.reward if scored else None)
        out["reward_components"].append(dict(traj.reward_components) if scored else {})
        out["status"].append(str(traj.status))
    return out


def passthrough_reward(
    prompts: list, completions: list, reward: list[float | None], **kwargs: Any
) -> list[float | None]:
    """TRL reward function returning the environment reward the rollout forwarded."""
    if len(reward) != len(completions):
        raise ValueError(f"got {len(reward)} rewards for {len(completions)} completions")
    return list(reward)


def component_reward(name: str) -> Callable[..., list[float | None]]:
    """A TRL reward function returning one named reward component (TRL logs it as
    ``rewards/NAME``). Use the components *instead of* ``passthrough_reward`` (the reward
    is their sum), or give them weight 0 in ``GRPOConfig.reward_weights`` to log only.
    A scored trajectory without that component gets 0.0; an unscored one ``None``."""

    def reward_fn(
        prompts: list, completions: list, reward_components: list[dict[str, float]],
        reward: list[float | None], **kwargs: Any,
    ) -> list[float | None]:  # fmt: skip
        pairs = zip(reward_components, reward, strict=True)
        return [None if r is None else c.get(name, 0.0) for c, r in pairs]

    reward_fn.__name__ = reward_fn.__qualname__ = name
    return reward_fn


async def _build(engine: EngineSource) -> Engine:
    """The engine, built on the calling (owned) loop when given as a spec or factory."""
    if isinstance(engine, str):
        from loomrl.engines import load

        return load(engine)
    if _is_engine(engine):
        return engine  # type: ignore[return-value]
    built = engine()  # type: ignore[operator]
    return await built if inspect.isawaitable(built) else built


def _is_engine(engine: object) -> bool:
    """An engine object (a class has the protocol's attributes too, but is a factory)."""
    return isinstance(engine, Engine) and not isinstance(engine, type)
