"""``colocate`` (scripted engine, tiny model): the engine sleeps after each batch is
produced, the learner trains while it sleeps, its gradients are freed and the allocator's
cache emptied before the engine's weights wake, the weights wake before the sync and the
KV cache after; ``auto`` is on only with one GPU, an in-process engine and settings that
allow it; the engine takes the memory plan's share of the GPU; settings that cannot share
one device are refused by name."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from simulated_gpus import GB, qwen2_dir, simulate_gpus
from test_loop import config, engines  # noqa: F401  (the fixture)

from loomrl.run import engines as engines_module
from loomrl.run import trainer as trainer_module
from loomrl.run.train import train
from loomrl.run.train_plan import plan_train
from loomrl.train.config import TrainConfig
from loomrl.train.config_rules import resolve_colocate


class Sleepy:
    """The scripted engine with vLLM's sleep and wake_up, every call logged in order."""

    def __init__(self, engine, log: list[str]) -> None:
        self._engine, self.log = engine, log

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def sleep(self, level: int = 1) -> None:
        self.log.append(f"sleep {level}")

    async def wake_up(self, tags=None) -> None:
        self.log.append(f"wake {','.join(tags)}")

    async def update_weights(self, weights, version=None) -> float:
        self.log.append("sync")
        return await self._engine.update_weights(weights, version=version)


@pytest.mark.parametrize("level", [1, 2])
async def test_the_engine_sleeps_while_the_learner_trains(tmp_path, engines, monkeypatch, level):  # noqa: F811
    log: list[str] = []
    learn = trainer_module.Trainer.learn

    def logged_learn(self, step, trajs):
        log.append("learn")
        return learn(self, step, trajs)

    monkeypatch.setattr(trainer_module.Trainer, "learn", logged_learn)
    rows = await train(
        config(steps=2, colocate=True, sleep_level=level), tmp_path,
        make_engine=lambda *a: Sleepy(engines(*a), log),
    )  # fmt: skip
    one_step = [f"sleep {level}", "learn", "wake weights", "sync", "wake kv_cache"]
    assert log == one_step * 2
    assert [r["policy_version"] for r in rows] == [1, 2]


@pytest.mark.parametrize("extra", [{}, {"algorithm": "ppo"}], ids=["policy", "with-critic"])
async def test_gradients_are_freed_and_the_cache_emptied_before_the_engine_wakes(
    tmp_path,
    engines,  # noqa: F811
    monkeypatch,
    extra,
):
    log: list[str] = []
    learn, models = trainer_module.Trainer.learn, []

    def trained(self):
        critic = [] if self.critic is None else list(self.critic.model.parameters())
        return [*self.learner.model.parameters(), *critic]

    def logged_learn(self, step, trajs):
        row = learn(self, step, trajs)
        models.append(self.models)
        kept = all(p.grad is not None for p in trained(self.models) if p.requires_grad)
        log.append("learn, gradients kept" if kept else "learn")
        return row

    class Watching(Sleepy):
        async def wake_up(self, tags=None) -> None:
            if tags == ["weights"]:
                freed = all(p.grad is None for p in trained(models[-1]))
                self.log.append("gradients freed" if freed else "gradients held")
            await super().wake_up(tags)

    monkeypatch.setattr(trainer_module.Trainer, "learn", logged_learn)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    await train(
        config(steps=2, colocate=True, **extra), tmp_path,
        make_engine=lambda *a: Watching(engines(*a), log),
    )  # fmt: skip
    step = ["sleep 1", "learn, gradients kept", "empty_cache", "gradients freed", "wake weights"]
    assert log == [*step, "sync", "wake kv_cache"] * 2


def test_auto_colocates_the_learners_gpu_with_an_in_process_engine(monkeypatch):
    assert config().colocate == "auto" and not resolve_colocate(config())  # this CPU
    simulate_gpus(monkeypatch, 80 * GB)
    assert resolve_colocate(config())
    assert trainer_module.engine_options(config())["enable_sleep_mode"] is True
    for off in ({"producer": "async"}, {"engines": ["http://127.0.0.1:9"]}, {"device": "cpu"},
                {"sleep_level": 2, "sync_weights_interval": 2, "max_staleness": 1}):  # fmt: skip
        assert not resolve_colocate(config(**off)), off  # refused with true: off with auto
    assert not resolve_colocate(config(colocate=False))
    simulate_gpus(monkeypatch, 80 * GB, count=2)  # vLLM still starts on the learner's cuda:0
    assert resolve_colocate(config())
    assert not resolve_colocate(config(learner_world_size=2))  # refused with true: off


def test_the_engine_takes_its_share_of_the_gpu_from_the_plan(tmp_path, monkeypatch):
    simulate_gpus(monkeypatch, 80 * GB)
    model = qwen2_dir(tmp_path, "0.5b")
    asked = TrainConfig(model=str(model), steps=2, prompts_per_step=2, n=2)
    plan = plan_train(asked, tmp_path / "run")
    assert plan.memory is not None and plan.memory.planned_utilization
    orders = []
    monkeypatch.setattr(engines_module, "build_engine", orders.append)
    trainer_module.default_engine(plan)(model, 0)
    args = orders[0].engine_args
    assert args["gpu_memory_utilization"] == plan.memory.engine_utilization < 0.2
    assert args["enable_sleep_mode"] is True
    user = asked.model_copy(update={"engine_args": {"gpu_memory_utilization": 0.3}})
    trainer_module.default_engine(plan_train(user, tmp_path / "run2"))(model, 0)
    assert orders[1].engine_args["gpu_memory_utilization"] == 0.3


def test_the_engine_args_ask_for_sleep_mode_only_when_colocated():
    assert trainer_module.engine_options(config(colocate=True)) == {
        "weight_sync": "transfer", "enable_sleep_mode": True,
    }  # fmt: skip
    assert trainer_module.engine_options(config(weight_sync="file")) == {"weight_sync": "file"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"engines": ["http://127.0.0.1:9"]}, "leave engines empty"),
     ({"producer": "async"}, "needs producer = 'sync'"),
     ({"learner_world_size": 2}, "learner_world_size must be 1"),
     ({"sleep_level": 2, "sync_weights_interval": 2}, "sync_weights_interval must be 1"),
     ({"sleep_level": 3}, "sleep_level")],
)  # fmt: skip
def test_settings_that_cannot_share_a_device_are_refused(overrides, message):
    with pytest.raises(ValidationError, match=message):
        config(colocate=True, max_staleness=1, **overrides)
