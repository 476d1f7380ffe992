"""The run's engine from ``model`` and ``engines``: one engine, or a pool of replicas;
replica lists that cannot serve the run are refused before anything starts."""

from __future__ import annotations

import pytest

from loomrl.engines import EnginePool, ScriptedEngine
from loomrl.engines.replicas import (
    check_replicas,
    engine_metrics,
    has_remote,
    open_engines,
    split_model_flags,
)
from loomrl.types import SamplingParams

MODEL = "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "values, expected",
    [
        ([MODEL], (MODEL, [])),
        ([MODEL, MODEL], (MODEL, [MODEL, MODEL])),
        (["http://a:1"], (None, ["http://a:1"])),
        (["http://a:1", MODEL], (MODEL, ["http://a:1", MODEL])),
        (["http://a:1", "https://b:2"], (None, ["http://a:1", "https://b:2"])),
    ],
)
def test_model_flags_split_into_model_and_replicas(values, expected):
    assert split_model_flags(values) == expected


def test_two_different_models_on_the_command_line_are_refused():
    with pytest.raises(ValueError, match=r"--model names 2 different models \(a, b\)"):
        split_model_flags(["a", "http://x:1", "b"])


def test_replicas_must_be_servers_or_the_runs_model():
    check_replicas(MODEL, ["http://a:1", MODEL, "https://b:2/"])
    with pytest.raises(ValueError, match="'tiny-random' is neither a server URL"):
        check_replicas(MODEL, ["tiny-random"])
    with pytest.raises(ValueError, match="http://a:1 more than once"):
        check_replicas(MODEL, ["http://a:1", "http://a:1/"])
    assert has_remote(["x", "http://a:1"]) and not has_remote([MODEL])


async def test_no_replicas_is_the_one_local_engine():
    made: list[ScriptedEngine] = []
    engine = await open_engines(MODEL, [], lambda: made.append(ScriptedEngine(["hi"])) or made[-1])
    assert engine is made[0] and engine_metrics(engine) == {}


async def test_repeated_spec_makes_a_pool_of_local_replicas_with_metrics():
    made: list[ScriptedEngine] = []

    def local() -> ScriptedEngine:
        made.append(ScriptedEngine(lambda ids, p: "ok"))
        return made[-1]

    engine = await open_engines(MODEL, [MODEL, MODEL], local)
    assert isinstance(engine, EnginePool) and len(made) == 2
    for i in range(4):
        out = await engine.generate([1, 2, 3], SamplingParams(max_tokens=4), f"run-g{i}:0")
        assert bytes(out.token_ids) == b"ok"
    row = engine_metrics(engine)
    assert row["engine/replicas"] == 2 and row["engine/healthy"] == 2
    assert row["engine/0/requests"] + row["engine/1/requests"] == 4
    assert row["engine/failovers"] == 0
    await engine.close()


async def test_a_replica_that_fails_to_start_closes_those_already_open():
    made: list[ScriptedEngine] = []

    def local() -> ScriptedEngine:
        if made:
            raise RuntimeError("second engine failed to start")
        made.append(ScriptedEngine(["hi"]))
        return made[-1]

    with pytest.raises(RuntimeError, match="second engine"):
        await open_engines(MODEL, [MODEL, MODEL], local)
    with pytest.raises(RuntimeError, match="closed"):
        await made[0].generate([1], SamplingParams(max_tokens=1))
