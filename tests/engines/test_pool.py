"""EnginePool over scripted replicas: routing, affinity, failover, health, versions, abort.

Replicas are ScriptedEngines; the one boundary faked on top is a replica's death
(``Flaky``): its in-flight and later requests raise ``EngineUnavailable``, as a remote
engine's would on a reset connection. Replies depend only on the prompt, so a request
failed over to another replica must come back with exactly the tokens it would have had.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from PIL import Image

from loomrl import Environment, EnvStep, SamplingParams, Status, rollout
from loomrl.engines import EngineUnavailable, ScriptedEngine, pool
from loomrl.engines.pool import EnginePool, affinity_key
from loomrl.episode.context import RolloutContext

PARAMS = SamplingParams(max_tokens=64)
STEP = {"step_base_s": 0.001}  # requests stay in flight for a few ms


def echo(prompt_ids, params):
    return f"len {len(prompt_ids)} first {prompt_ids[0]}"


def expected(prompt_ids) -> list[int]:
    return list(echo(prompt_ids, PARAMS).encode())


class Flaky:
    """A replica that can die: ``kill()`` fails its in-flight requests and refuses new
    ones with ``EngineUnavailable``; ``die_after`` kills it as that many requests arrive
    (the last of them still in flight); ``revive()`` brings it back (``health`` says so)."""

    def __init__(self, inner: ScriptedEngine, die_after: int | None = None) -> None:
        self.inner = inner
        self.die_after = die_after
        self.down = False
        self.calls = 0
        self.served: list[str] = []
        self._dead = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def kill(self) -> None:
        self.down = True
        self._dead.set()

    def revive(self) -> None:
        self.down = False
        self._dead = asyncio.Event()

    async def health(self) -> bool:
        return not self.down

    async def generate(self, prompt_ids, params, request_id=None, **images):
        if self.down:
            raise EngineUnavailable("connection refused")
        self.calls += 1
        if self.calls == self.die_after:
            asyncio.get_running_loop().call_later(0.002, self.kill)
        work = asyncio.ensure_future(self.inner.generate(prompt_ids, params, request_id, **images))
        dead = asyncio.ensure_future(self._dead.wait())
        await asyncio.wait({work, dead}, return_when=asyncio.FIRST_COMPLETED)
        dead.cancel()
        if not work.done():
            work.cancel()
            raise EngineUnavailable("connection reset by peer")
        out = work.result()
        self.served.append(out.request_id)
        return out

    async def update_weights(self, weights, version=None):
        if self.down:
            raise EngineUnavailable("connection refused")
        return await self.inner.update_weights(weights, version=version)


class Held:
    """A ``sleep`` for ScriptedEngine that holds every step until ``release()``."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def __call__(self, _cost: float) -> None:
        await self.go.wait()

    def release(self) -> None:
        self.go.set()


@pytest.fixture
async def engines():
    """Build byte-level scripted replicas (echo replies) closed after the test."""
    made: list[ScriptedEngine] = []

    def make(k: int, **kwargs) -> list[ScriptedEngine]:
        for key, value in STEP.items():
            kwargs.setdefault(key, value)
        made.extend(ScriptedEngine(echo, **kwargs) for _ in range(k))
        return made[-k:]

    yield make
    for engine in made:
        await engine.close()


async def settle(condition, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


# -- construction ----------------------------------------------------------------------
def test_validation_names_the_mismatching_replica():
    with pytest.raises(ValueError, match="at least one engine"):
        EnginePool([])
    with pytest.raises(ValueError, match=r"replica 1 \(ScriptedEngine\) has vocab_size 300"):
        EnginePool([ScriptedEngine(), ScriptedEngine(vocab_size=300)])
    stale = ScriptedEngine()
    stale.set_policy_version(2)
    with pytest.raises(ValueError, match=r"replica 1 .* policy_version 2"):
        EnginePool([ScriptedEngine(), stale])
    mixed = pool([ScriptedEngine(max_model_len=512), ScriptedEngine(max_model_len=256)])
    assert (mixed.max_model_len, mixed.vocab_size, mixed.policy_version) == (256, 256, 0)


def test_affinity_key_is_the_part_before_the_last_colon():
    assert affinity_key("run-3.1:7") == "run-3.1"
    assert affinity_key("a:b:2") == "a:b"
    assert affinity_key("run-7") is None


def test_rollout_request_ids_share_the_trajectory_key():
    ctx = RolloutContext(*[None] * 10, run_id="r1")  # type: ignore[arg-type]
    ids = [ctx.request_id("4.1"), ctx.request_id("4.1"), ctx.request_id("5.0"), ctx.request_id()]
    assert ids == ["r1-4.1:0", "r1-4.1:1", "r1-5.0:2", "r1-3"]
    assert affinity_key(ids[0]) == affinity_key(ids[1]) != affinity_key(ids[2])


# -- routing ---------------------------------------------------------------------------
async def test_least_outstanding_spreads_concurrent_requests_evenly(engines):
    replicas = engines(4)
    p = pool(replicas)
    outs = await asyncio.gather(*(p.generate([i + 1], PARAMS) for i in range(40)))
    assert [o.token_ids for o in outs] == [expected([i + 1]) for i in range(40)]
    assert [r.requests_served for r in replicas] == [10] * 4
    assert [m["requests"] for m in p.metrics()["replicas"]] == [10] * 4
    assert p.in_flight == 0


async def test_affinity_keeps_each_trajectory_on_one_replica(engines):
    flaky = [Flaky(e) for e in engines(3)]
    p = pool(flaky)

    async def trajectory(k: int) -> None:
        for turn in range(4):
            await p.generate([k + 1, turn + 1], PARAMS, f"run-{k}.0:{turn}")

    await asyncio.gather(*(trajectory(k) for k in range(9)))
    homes = {affinity_key(rid): i for i, replica in enumerate(flaky) for rid in replica.served}
    for i, replica in enumerate(flaky):
        assert all(homes[affinity_key(rid)] == i for rid in replica.served)
    assert Counter(homes.values()) == {0: 3, 1: 3, 2: 3}  # the first turns spread
    metrics = p.metrics()
    assert metrics["pool"]["affinity_hit_rate"] == 1.0
    assert sum(m["affinity_hits"] for m in metrics["replicas"]) == 9 * 3


async def test_the_affinity_map_is_bounded(engines):
    p = pool(engines(2), affinity_capacity=2)
    for key in ("a", "b", "c"):  # "a" is forgotten when "c" arrives
        await p.generate([1], PARAMS, f"{key}:0")
    for key in ("a", "c"):
        await p.generate([1], PARAMS, f"{key}:1")
    hits = sum(m["affinity_hits"] for m in p.metrics()["replicas"])
    misses = sum(m["affinity_misses"] for m in p.metrics()["replicas"])
    assert (hits, misses) == (1, 0)  # "c" came back to its replica; "a" was routed afresh


async def test_affinity_moves_off_an_overloaded_replica(engines):
    held = Held()
    replicas = engines(2, sleep=held)
    p = pool(replicas, max_outstanding=2)
    first = asyncio.ensure_future(p.generate([1], PARAMS, "t:0"))
    await settle(lambda: replicas[0].in_flight == 1)
    more = [asyncio.ensure_future(p.generate([1], PARAMS, f"t:{n}")) for n in (1, 2)]
    await settle(lambda: replicas[0].in_flight + replicas[1].in_flight == 3)
    assert (replicas[0].in_flight, replicas[1].in_flight) == (2, 1)  # the third moved
    held.release()
    await asyncio.gather(first, *more)
    one = p.metrics()["replicas"][0]
    assert (one["affinity_hits"], one["affinity_misses"]) == (1, 1)
    assert one["affinity_hit_rate"] == 0.5
    # the key moved with it: its next request goes to replica 1
    await p.generate([1], PARAMS, "t:3")
    assert p.metrics()["replicas"][1]["affinity_hits"] == 1


async def test_affinity_moves_off_a_retired_replica(engines):
    flaky = [Flaky(e) for e in engines(2)]
    p = pool(flaky)
    await p.generate([1], PARAMS, "t:0")
    home = 0 if flaky[0].served else 1
    flaky[home].kill()
    out = await p.generate([2], PARAMS, "t:1")
    assert out.token_ids == expected([2])
    assert flaky[1 - home].served == ["t:1"]
    metrics = p.metrics()["replicas"]
    assert metrics[home]["affinity_misses"] == 1 and not metrics[home]["healthy"]
    assert metrics[home]["failovers"] == 1
    await p.close()


# -- failover --------------------------------------------------------------------------
async def test_failover_returns_one_completion_per_call_with_the_right_tokens(engines):
    flaky = [Flaky(e, die_after=d) for e, d in zip(engines(3), (5, None, None), strict=True)]
    p = pool(flaky, health_interval_s=60)
    prompts = [[i + 1, 7] for i in range(30)]
    ids = [f"req-{i}:0" for i in range(30)]
    outs = await asyncio.gather(
        *(p.generate(q, PARAMS, r) for q, r in zip(prompts, ids, strict=True))
    )
    assert [o.token_ids for o in outs] == [expected(q) for q in prompts]
    assert [o.request_id for o in outs] == ids
    served = flaky[0].served + flaky[1].served + flaky[2].served
    assert sorted(served) == sorted(ids)  # each request completed exactly once
    metrics = p.metrics()
    assert not metrics["replicas"][0]["healthy"]
    assert metrics["pool"]["healthy"] == 2
    assert metrics["pool"]["failovers"] == metrics["replicas"][0]["failovers"] >= 1
    assert p.in_flight == 0
    await p.close()


async def test_no_healthy_replica_raises_engine_unavailable(engines):
    flaky = [Flaky(e) for e in engines(2)]
    p = pool(flaky)
    for replica in flaky:
        replica.kill()
    with pytest.raises(EngineUnavailable, match="no healthy engine replica in the pool of 2"):
        await p.generate([1], PARAMS, "t:0")
    assert p.failovers == 2  # each replica's failure moved the request once
    with pytest.raises(EngineUnavailable, match="connection refused"):
        await p.generate([1], PARAMS)
    await p.close()


async def test_request_errors_propagate_without_failover(engines):
    p = pool(engines(2))
    with pytest.raises(ValueError, match="outside"):
        await p.generate([999], PARAMS)
    assert p.metrics()["pool"]["healthy"] == 2 and p.failovers == 0


# -- a whole rollout -------------------------------------------------------------------
class Countdown(Environment):
    name = "countdown"
    max_turns = 3

    def step(self, state, message):
        return EnvStep([{"role": "user", "content": f"left {state.turn}"}], done=False)

    def score(self, state):
        return 1.0


async def test_rollout_survives_a_replica_dying_mid_rollout(make_engine, check_contract):
    reply = lambda ids, params: f"guess {len(ids)}"  # noqa: E731
    flaky = [
        Flaky(make_engine(reply, **STEP), die_after=12),
        Flaky(make_engine(reply, **STEP)),
    ]
    p = pool(flaky, health_interval_s=60)
    examples = [{"question": f"Q{k}"} for k in range(8)]
    result = await rollout(p, Countdown(), examples, n=2)
    assert len(result) == 16
    for traj in result:
        assert traj.status == Status.MAX_TURNS and traj.turns == 3
        check_contract(traj)
    served = flaky[0].served + flaky[1].served
    assert len(served) == len(set(served)) == 16 * 3
    keys = Counter(affinity_key(rid) for rid in served)
    assert len(keys) == 16 and set(keys.values()) == {3}  # one key per trajectory
    assert p.failovers >= 1 and not p.metrics()["replicas"][0]["healthy"]
    await p.close()


# -- health and versions ---------------------------------------------------------------
async def test_readmission_needs_health_and_the_pool_version(engines):
    flaky = [Flaky(e) for e in engines(2)]
    p = pool(flaky, health_interval_s=0.01)
    flaky[1].kill()
    for k in range(2):  # one of these lands on replica 1 and retires it
        await p.generate([1], PARAMS, f"t{k}:0")
    assert p.metrics()["pool"]["healthy"] == 1
    await p.update_weights({"w": 0})  # replica 1 is down: it misses the update
    assert p.policy_version == 1 and flaky[1].policy_version == 0
    flaky[1].revive()
    await asyncio.sleep(0.1)  # healthy, but on stale weights: still retired
    assert not p.metrics()["replicas"][1]["healthy"]
    flaky[1].inner.set_policy_version(1)
    await settle(lambda: p.metrics()["replicas"][1]["healthy"])
    assert p.policy_version == 1
    await p.close()


async def test_a_replica_that_came_back_catches_up_at_the_next_update(engines):
    flaky = [Flaky(e) for e in engines(2)]
    p = pool(flaky, health_interval_s=60)
    flaky[0].kill()
    await p.generate([1], PARAMS, "a:0")
    await p.generate([1], PARAMS, "b:0")
    await p.update_weights({"w": 0})
    flaky[0].revive()
    await p.update_weights({"w": 0})  # its probe passes: it is sent the weights too
    assert [f.policy_version for f in flaky] == [2, 2]
    assert p.metrics()["pool"]["healthy"] == 2
    await p.close()


async def test_update_weights_fans_out_and_retires_a_failing_replica(engines):
    flaky = [Flaky(e) for e in engines(3)]
    p = pool(flaky)
    assert await p.update_weights({"a": 1, "b": 2}) == 0.0
    assert [f.inner.weight_updates for f in flaky] == [[2]] * 3
    assert [f.policy_version for f in flaky] == [1, 1, 1] and p.policy_version == 1
    flaky[2].kill()
    await p.update_weights({"a": 1}, version=5)
    assert [f.policy_version for f in flaky] == [5, 5, 1] and p.policy_version == 5
    assert not p.metrics()["replicas"][2]["healthy"]
    out = await p.generate([1], PARAMS)
    assert out.policy_version == 5  # the stale replica does not serve
    await p.close()


# -- abort and score -------------------------------------------------------------------
async def test_abort_goes_to_the_replicas_holding_the_requests(engines):
    held = Held()
    replicas = engines(2, sleep=held)
    p = pool(replicas)
    calls = [asyncio.ensure_future(p.generate([i + 1], PARAMS, f"r{i}:0")) for i in range(4)]
    await settle(lambda: p.in_flight == 4)
    assert sorted(await p.abort(["r0:0", "r3:0", "unknown"])) == ["r0:0", "r3:0"]
    assert [replica.in_flight for replica in replicas] == [1, 1]
    assert await p.abort() in (["r1:0", "r2:0"], ["r2:0", "r1:0"])
    outs = await asyncio.gather(*calls)
    assert [o.finish_reason for o in outs] == ["abort"] * 4
    assert p.failovers == 0 and p.in_flight == 0


class DiesOnAbort(Flaky):
    """A replica whose abort kills it: the aborted request fails with a transport error."""

    async def abort(self, request_ids=None):
        self.kill()
        return [request_ids] if isinstance(request_ids, str) else list(request_ids or [])


async def test_an_aborted_request_is_not_failed_over(engines):
    dying, spare = DiesOnAbort(engines(1)[0]), Flaky(engines(1)[0])
    p = pool([dying, spare], health_interval_s=60)
    call = asyncio.ensure_future(p.generate([1], PARAMS, "t:0"))
    await settle(lambda: p.in_flight == 1)
    assert await p.abort("t:0") == ["t:0"]
    out = await call
    assert (out.finish_reason, out.token_ids, out.request_id) == ("abort", [], "t:0")
    assert spare.calls == 0 and p.failovers == 0
    await p.close()


class Scoring(ScriptedEngine):
    async def score(self, token_ids):
        return [-1.0] * (len(token_ids) - 1)


async def test_score_and_tokenizer_come_from_a_replica():
    p = pool([Scoring(), Scoring()])
    assert await p.score([1, 2, 3]) == [-1.0, -1.0]
    assert p.tokenizer is None
    await p.close()


class Stalling:
    """A replica that times out: its requests hang until aborted, then the pool's wait
    for it ends in ``TimeoutError`` (as a remote engine's read timeout would)."""

    def __init__(self, inner: ScriptedEngine) -> None:
        self.inner = inner
        self.aborted: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, params, request_id=None):
        await asyncio.sleep(0.01)
        raise TimeoutError(f"no answer to {request_id} in time")

    async def abort(self, request_ids=None):
        self.aborted.append(request_ids)
        return [request_ids]


async def test_a_request_failed_over_after_a_timeout_is_aborted_where_it_hung():
    slow = Stalling(ScriptedEngine(echo))
    engines = EnginePool([slow, ScriptedEngine(echo)], health_interval_s=0.05)
    out = await engines.generate([5, 6, 7], PARAMS, "run-g0.0:0")  # first to replica 0
    assert out.token_ids == expected([5, 6, 7]) and engines.failovers == 1
    await asyncio.sleep(0.02)  # the background abort ran
    assert slow.aborted == ["run-g0.0:0"]
    await engines.close()


@pytest.mark.parametrize("routing", ["least", "random"])
async def test_baseline_routings_ignore_affinity(routing):
    engines = EnginePool([ScriptedEngine(echo) for _ in range(4)], routing=routing, seed=1)
    for turn in range(8):
        await engines.generate([1, 2, turn + 3], PARAMS, f"run-g0.0:{turn}")
    served = [r.requests for r in engines.replicas]
    assert sum(served) == 8 and max(served) < 8  # one trajectory, spread over replicas
    assert sum(r.affinity_hits for r in engines.replicas) == 0
    with pytest.raises(
        ValueError, match="routing must be one of affinity, trajectory, least, random"
    ):
        EnginePool([ScriptedEngine(echo)], routing="sticky")
    await engines.close()


class TextOnly:
    """A replica whose ``generate`` takes no ``images`` (a text-only engine's signature)."""

    def __init__(self, inner: ScriptedEngine) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, params, request_id=None):
        return await self.inner.generate(prompt_ids, params, request_id)


def pictures(k: int) -> list[Image.Image]:
    return [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(k)]


async def test_images_reach_the_replica_that_serves_the_request(engines):
    replicas = engines(2)
    p = EnginePool(replicas)
    shown = pictures(2)
    out = await p.generate([1, 2, 3], PARAMS, "run-0.0:0", images=shown)
    text = await p.generate([4, 5], PARAMS, "run-0.1:0")
    assert out.token_ids == expected([1, 2, 3]) and text.token_ids == expected([4, 5])
    seen = {rid: images for r in replicas for rid, images in r.images_seen.items()}
    assert seen == {"run-0.0:0": shown}  # the same images, in order; none with the text


async def test_a_failed_over_request_is_sent_again_with_the_same_images(engines):
    dying, healthy = Flaky(engines(1)[0], die_after=1), engines(1)[0]
    p = EnginePool([dying, healthy], health_interval_s=60)
    shown = pictures(3)
    out = await p.generate([9, 8, 7], PARAMS, "run-0.0:0", images=shown)
    assert p.failovers == 1 and out.token_ids == expected([9, 8, 7])
    assert dying.inner.images_seen == {"run-0.0:0": shown}  # sent there first, then lost
    assert healthy.images_seen == {"run-0.0:0": shown}  # and again, whole, to the next
    await p.close()


async def test_replicas_that_take_no_images_still_serve_text(engines):
    p = EnginePool([TextOnly(e) for e in engines(2)])
    assert not p.vision and p.model_path is None
    out = await p.generate([1, 2], PARAMS, "run-0.0:0")
    assert out.token_ids == expected([1, 2])
    with pytest.raises(TypeError, match="images"):  # a text-only engine cannot take them
        await p.generate([1, 2], PARAMS, "run-0.0:1", images=pictures(1))


# -- group affinity ----------------------------------------------------------------------
@pytest.mark.parametrize(("routing", "together"), [("affinity", True), ("trajectory", False)])
async def test_a_groups_samples_start_on_one_replica(routing, together):
    """A GRPO group's n samples open with the same prompt: with group affinity their
    first turns go where the group's first went (one prefill), then each stays."""
    engines = EnginePool([ScriptedEngine(echo) for _ in range(4)], routing=routing)
    for sample in range(4):
        await engines.generate([1, 2, 3], PARAMS, f"run-7.{sample}:0")
    served = [r.requests for r in engines.replicas]
    assert (max(served) == 4) is together and sum(served) == 4
    await engines.generate([9, 9], PARAMS, "run-8.0:0")  # another group: the least loaded
    await engines.generate([1, 2, 3, 4], PARAMS, "run-7.2:1")  # a sample's next turn stays
    assert engines.metrics()["pool"]["affinity_hit_rate"] == 1.0
    await engines.close()


async def test_group_affinity_yields_to_load():
    """All n samples of a group in flight at once: the group's replica takes them until
    it is overloaded (``2 * least + affinity_slack``), the rest spread."""
    held = Held()
    replicas = [ScriptedEngine(echo, sleep=held, **STEP) for _ in range(2)]
    engines = EnginePool(replicas, affinity_slack=2)
    calls = [asyncio.ensure_future(engines.generate([1, 2, 3], PARAMS, f"run-5.{i}:0"))
             for i in range(8)]  # fmt: skip
    await asyncio.sleep(0.01)
    loads = sorted(r.outstanding for r in engines.replicas)
    assert sum(loads) == 8 and loads[1] > loads[0] and loads[1] <= 2 * loads[0] + 3
    held.release()
    await asyncio.gather(*calls)
    await engines.close()


# -- active health probes ----------------------------------------------------------------
class Hung:
    """A replica that stops answering: its generates and its health probes hang (a
    server that accepts connections and never replies) until ``wake()``."""

    def __init__(self, inner: ScriptedEngine) -> None:
        self.inner = inner
        self.hung = False
        self.cancelled = 0
        self.aborted: list[object] = []
        self._awake = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def wake(self) -> None:
        self.hung = False
        self._awake.set()

    async def health(self) -> bool:
        if self.hung:
            await asyncio.sleep(3600)
        return True

    async def generate(self, prompt_ids, params, request_id=None, **images):
        if not self.hung:
            return await self.inner.generate(prompt_ids, params, request_id, **images)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def abort(self, request_ids=None):
        self.aborted.append(request_ids)
        if self.hung:
            await asyncio.sleep(3600)
        return []


async def test_a_replica_that_hangs_is_drained_and_its_requests_move_on():
    hung = Hung(ScriptedEngine(echo))
    engines = EnginePool([hung, ScriptedEngine(echo)], health_interval_s=0.05,
                         probe_timeout_s=0.05, probe_failures=2)  # fmt: skip
    await engines.generate([1, 2], PARAMS, "run-1.0:0")  # replica 0 served it: home
    assert engines.replicas[0].requests == 1
    hung.hung = True
    begin = asyncio.get_running_loop().time()
    out = await engines.generate([1, 2, 3], PARAMS, "run-1.0:1")  # its home hangs
    waited = asyncio.get_running_loop().time() - begin
    assert out.token_ids == expected([1, 2, 3])  # the same request, answered elsewhere
    assert 0.1 <= waited < 5.0  # two failed probes (deadline 0.05 s each), not 3600 s
    assert hung.cancelled == 1 and engines.failovers == 1
    assert engines.replicas[0].retired.startswith("drained: 2 health probes in a row")
    assert engines.replicas[1].requests == 1
    await asyncio.sleep(0.1)
    assert hung.aborted == ["run-1.0:1"]  # left behind where it hung (and bounded too)
    hung.wake()  # answers again, on the pool's weights: serves again
    await settle(lambda: engines.replicas[0].retired is None)
    await engines.close()


async def test_one_failed_probe_does_not_drain_a_replica():
    flaky = Flaky(ScriptedEngine(echo))
    engines = EnginePool([flaky, ScriptedEngine(echo)], health_interval_s=0.02,
                         probe_failures=3)  # fmt: skip
    await engines.generate([1], PARAMS, "run-1.0:0")
    for _ in range(5):  # down for one probe at a time, then up again
        flaky.down = True
        await asyncio.sleep(0.03)
        flaky.down = False
        await asyncio.sleep(0.05)
    assert engines.replicas[0].retired is None
    await engines.close()


async def test_the_callers_own_cancellation_is_not_a_failover():
    held = Held()
    engines = EnginePool(
        [ScriptedEngine(echo, sleep=held, **STEP), ScriptedEngine(echo, sleep=held, **STEP)]
    )
    call = asyncio.ensure_future(engines.generate([1, 2], PARAMS, "run-1.0:0"))
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert engines.failovers == 0 and all(r.retired is None for r in engines.replicas)
    assert all(not r.calls for r in engines.replicas)
    await engines.close()
