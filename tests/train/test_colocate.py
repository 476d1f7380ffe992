"""``colocate = true`` (scripted engine, tiny model): the engine sleeps after each batch
is produced, the learner trains while it sleeps, its weights wake before the sync and its
KV cache after; settings that cannot share one device are refused by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_loop import config, engines  # noqa: F401  (the fixture)

from loomrl.run import trainer as trainer_module
from loomrl.run.train import train


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
