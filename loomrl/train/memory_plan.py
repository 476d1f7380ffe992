"""A training run's memory, planned before anything loads: per device, the parts of the
learner and of the in-process engine (``loomrl.train.memory_parts``) in the rollout phase
(the engine generates) and the learning phase (the learner's peak), whether they fit, the
engine's ``gpu_memory_utilization`` and the micro-batch budget.

The model's shape comes from its ``config.json`` on the meta device; each GPU's total and
free memory from the driver (``loomrl.hardware.gpu_memory``). What other processes already
use counts against the card, and on a learner's card 10% stays free for its caching
allocator's slack (fragmentation between micro-batches of different sizes, cuBLAS
workspaces).

- The engine's share: vLLM 0.32 takes ``gpu_memory_utilization`` of the card's *total*
  memory and refuses to start when that is more than is free then (the learner has loaded:
  its weights, the reference, the critic). Beside a learner the plan gives it its weights,
  buffers and graphs, and a KV cache for every trajectory in flight at full length
  (``concurrency`` × ``max_len``) plus a margin, at most what the learner leaves: while
  the engine generates when it sleeps through learning (``colocate``), else beside the
  learner's peak with the smallest micro-batch. Alone on its GPU (a CPU learner) it keeps
  vLLM's default, or what is free there when other processes hold more; the allocator
  slack is the learner's (vLLM keeps its own headroom, ``1 - gpu_memory_utilization``).
  A user's ``engine_args.gpu_memory_utilization`` wins and is checked the same way.
- ``micro_batch_tokens = "auto"``: what the learning phase leaves for activations on the
  tightest learner device, in steps of 256 up to 65,536; on a CPU (where the engine, the
  rollouts and the environments share the host) what a quarter of the available memory
  leaves, at least 256; several CPU ranks all run on the host and share that quarter.

A plan that does not fit carries one line naming the device, the largest parts and the
ways out; ``check`` raises it (``loomrl train`` before any model or engine loads).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from loomrl.train.budget import SMALLEST, tokens_for
from loomrl.train.memory_parts import (
    CONTEXT,
    ENGINE_MARGIN,
    GiB,
    Part,
    activation_bytes_per_token,
    asleep_on_host,
    engine_fixed,
    engine_parts,
    kv_need,
    learner_parts,
)
from loomrl.train.memory_request import DeviceMemory, Devices, Request, read_devices, request_of
from loomrl.train.model_shape import Shape

if TYPE_CHECKING:
    from loomrl.train.config import TrainConfig

SLACK = 0.1  # of a GPU's memory: the caching allocator's fragmentation, cuBLAS workspaces
CPU_SHARE = 0.25  # of the host's available memory a CPU learner's step may take
VLLM_UTILIZATION = 0.92  # vLLM's own default, for an engine alone on its GPU
PHASES = ("rollout", "learning")
BASE = ("used before the run", "allocator slack")  # a GPU's parts whatever the run does


class MemoryPlanError(ValueError):
    """A run whose parts do not fit its devices (one line: what, where, the ways out)."""


@dataclass(frozen=True)
class DevicePlan:
    """One device's parts and what they may take (a GPU's total, the host's free memory)."""

    memory: DeviceMemory
    parts: tuple[Part, ...]

    @property
    def capacity(self) -> int:
        """What the device can hold: a GPU's total; the host's total memory (what is
        available now moves with every other process and the page cache: a run needing
        more than that is told, not refused, ``plan_notes``)."""
        return self.memory.total

    @property
    def tight(self) -> bool:
        """A host whose parts need more than is available now (fits, but may swap)."""
        return not self.memory.is_gpu and max(map(self.peak, PHASES)) > self.memory.free

    def peak(self, phase: str) -> int:
        return sum(part.at(phase) for part in self.parts)


@dataclass(frozen=True)
class MemoryPlan:
    """Where every part of a run lives and whether it fits."""

    devices: tuple[DevicePlan, ...]
    micro_batch_tokens: int
    activation_bytes_per_token: int
    colocate: bool
    engine_utilization: float | None = None  # the engine's share of its GPU (None: vLLM's)
    planned_utilization: bool = False  # chosen by the plan (not the user's, not vLLM's)
    notes: tuple[str, ...] = ()
    refusal: str | None = None

    @property
    def fits(self) -> bool:
        return self.refusal is None

    def check(self) -> None:
        """Raise the refusal, if any (one line)."""
        if self.refusal is not None:
            raise MemoryPlanError(self.refusal)

    def engine_args(self) -> dict[str, float]:
        """What the run's in-process engine takes from the plan (its own args win)."""
        if self.planned_utilization and self.engine_utilization is not None:
            return {"gpu_memory_utilization": self.engine_utilization}
        return {}


def gib(size: float) -> str:
    return f"{size / GiB:.1f} GiB"


def build(request: Request, devices: Devices) -> MemoryPlan:
    """The plan of ``request`` on ``devices`` (see the module docstring)."""
    shape, learn, serve = request.shape, request.learning, request.serving
    per_token = activation_bytes_per_token(
        shape, learn.compute_bytes, learn.checkpointing, learn.weight_bytes
    )
    tokens = request.micro_batch_tokens or SMALLEST
    refusals: list[str] = []
    rows: dict[str, list[Part]] = {}
    memory = {d.name: d for d in (*devices.learner, devices.host)}
    for device in devices.learner:
        ranks = _ranks_on(device, request)
        parts = [_times(p, ranks) for p in learner_parts(shape, learn, tokens)]
        rows[device.name] = [*_base(device), *parts]
        if device.is_gpu:
            rows[device.name].append(Part("learner CUDA context", CONTEXT, CONTEXT))
    share, planned = None, False
    if serve is not None and devices.engine is not None:
        engine = devices.engine
        memory.setdefault(engine.name, engine)
        beside = rows.setdefault(engine.name, _base(engine, slack=False))
        share, planned, refused = _engine_share(request, engine, beside)
        refusals += refused
        context = CONTEXT if engine.is_gpu else 0
        beside += engine_parts(shape, serve, share, context)
        if engine.is_gpu and serve.sleeps:
            rows.setdefault(devices.host.name, []).extend(asleep_on_host(shape, serve))
    if request.micro_batch_tokens is None:
        tokens = _auto_tokens(rows, devices, request, per_token)
        for device in devices.learner:
            activations = tokens * per_token * _ranks_on(device, request)
            rows[device.name] = [_with_tokens(p, activations) for p in rows[device.name]]
    plans = tuple(DevicePlan(memory[name], tuple(parts)) for name, parts in rows.items())
    refusals += [r for plan in plans if (r := _overflow(plan, request)) is not None]
    engine = devices.engine
    utilization = None
    if share is not None and engine is not None and engine.is_gpu:
        utilization = request.utilization or round(share / engine.total, 4)
    return MemoryPlan(
        plans, tokens, per_token, request.colocate, utilization, planned,
        refusal=refusals[0] if refusals else None,
    )  # fmt: skip


def _base(device: DeviceMemory, slack: bool = True) -> list[Part]:
    """What a GPU holds whatever the run does: other processes' memory and, where a
    learner trains (``slack``), its caching allocator's slack."""
    if not device.is_gpu:
        return []
    used = device.total - device.free
    parts = [Part("used before the run", used, used)]
    if slack:
        kept = int(SLACK * device.total)
        parts.append(Part("allocator slack", kept, kept))
    return parts


def _floor_share(size: int, total: int) -> int:
    """``size`` rounded down to a ``gpu_memory_utilization`` of four decimals of ``total``."""
    return size * 10_000 // total * total // 10_000


def _engine_share(
    request: Request, engine: DeviceMemory, beside: list[Part]
) -> tuple[int, bool, list[str]]:
    """Each engine's share of its device (bytes), whether the plan chose it, refusals."""
    shape, serve = request.shape, request.serving
    assert serve is not None
    weights, buffers, graphs = engine_fixed(shape, serve)
    fixed = weights + buffers + graphs
    need, one = kv_need(shape, serve)
    if not engine.is_gpu:
        return fixed + request.cpu_kv_bytes, False, []
    if request.utilization is not None:
        share = int(request.utilization * engine.total)
        if share - fixed >= one:
            return share, False, []
        least = (fixed + one) / engine.total
        return share, False, [
            f"engine_args.gpu_memory_utilization = {request.utilization} gives vLLM "
            f"{gib(share)} of {engine.name} ({gib(engine.total)}): its weights, buffers and "
            f"CUDA graphs take {gib(fixed)} and one sequence of {serve.max_len} tokens "
            f"{gib(one)} more: set at least {least + 0.005:.2f} (or leave it out: the plan "
            "picks one)"
        ]  # fmt: skip
    if all(p.name in BASE for p in beside):  # alone on its GPU: vLLM's default if free
        default = _floor_share(int(VLLM_UTILIZATION * engine.total), engine.total)
        free = (engine.free - serve.count * CONTEXT) // serve.count
        share = max(fixed + one, min(default, _floor_share(free, engine.total)))
        return share, share != default, []
    phase = "rollout" if serve.sleeps else "learning"
    taken = sum(p.at(phase) for p in beside) + serve.count * CONTEXT
    room = (engine.total - taken) // serve.count - fixed
    kv = max(one, min(need + ENGINE_MARGIN, room))
    return _floor_share(fixed + kv, engine.total), True, []


def _ranks_on(device: DeviceMemory, request: Request) -> int:
    """Learner ranks on ``device``: one a GPU; every rank on a CPU (they run on this host)."""
    return 1 if device.is_gpu else request.learning.world


def _times(part: Part, ranks: int) -> Part:
    return part if ranks == 1 else Part(part.name, part.rollout * ranks, part.learning * ranks)


def _auto_tokens(
    rows: dict[str, list[Part]], devices: Devices, request: Request, per_token: int
) -> int:
    """The largest micro-batch whose activations fit every learner device's learning
    phase (a GPU's total; a CPU's share of its free memory, the learner's parts only,
    shared by every rank there), in steps of ``STEP``; at least ``SMALLEST`` (a GPU where
    even that does not fit overflows, and the plan says so)."""
    lefts = []
    for device in devices.learner:
        parts = [p for p in rows[device.name] if p.name != "activations"]
        if device.is_gpu:
            left = device.total - sum(p.learning for p in parts)
        else:
            learner = [p for p in parts if not p.name.startswith("engine")]
            left = int(CPU_SHARE * device.free) - sum(p.learning for p in learner)
        lefts.append(left // _ranks_on(device, request))
    return tokens_for(min(lefts), per_token)


def _with_tokens(part: Part, activations: int) -> Part:
    if part.name != "activations":
        return part
    return Part(part.name, part.rollout, activations)


def _overflow(plan: DevicePlan, request: Request) -> str | None:
    """The refusal for a device whose parts exceed it in either phase (the larger peak:
    what has to be cut), else None."""
    for phase in sorted(PHASES, key=plan.peak, reverse=True):
        peak = plan.peak(phase)
        if peak <= plan.capacity:
            continue
        named = [p for p in plan.parts if p.at(phase) and p.name != "allocator slack"]
        largest = sorted(named, key=lambda p: p.at(phase), reverse=True)[:3]
        listed = ", ".join(f"{p.name} ({gib(p.at(phase))})" for p in largest)
        when = "while the engine generates" if phase == "rollout" else "while learning"
        big_activations = any(p.name == "activations" for p in largest)
        ways = ", ".join(
            way for way in request.ways
            if big_activations or not way.startswith(("gradient_checkpointing", "micro_batch"))
        )  # fmt: skip
        return (
            f"{plan.memory.name}: {listed} and the rest need {gib(peak)} {when}, more than "
            f"its {gib(plan.capacity)}: set {ways or 'a shorter max_len'}, or a smaller model "
            "(loomrl train --plan shows every part)"
        )
    return None


def micro_batch_tokens(config: TrainConfig, plan: MemoryPlan | None = None) -> int:
    """The run's budget (``loomrl.train.budget``): ``micro_batch_tokens`` when set, else
    the memory plan's (``plan``, or one made now for learner rank 0's devices, before the
    models load: every rank plans the same micro-batches, so one number is chosen for
    all)."""
    if config.micro_batch_tokens != "auto":
        return int(config.micro_batch_tokens)
    return (plan or plan_memory(config)).micro_batch_tokens


def plan_memory(
    config: TrainConfig, shape: Shape | None = None, critic: Shape | None = None
) -> MemoryPlan:
    """``config``'s plan on this machine's devices now; the shapes are read from the model
    directories when not given (nothing is loaded)."""
    from loomrl.models import resolve

    if shape is None:
        shape = Shape.of(resolve(config.model))
    if critic is None and config.critic and config.critic_model is not None:
        critic = Shape.of(resolve(config.critic_model), backbone=True)
    request = request_of(config, shape, critic)
    plan = build(request, read_devices(config, request.serving is not None))
    return replace(plan, notes=plan_notes(config, plan))


def plan_notes(config: TrainConfig, plan: MemoryPlan) -> tuple[str, ...]:
    """What a person should know of the plan on a GPU (nothing on a CPU-only run)."""
    from loomrl.train.placement import precision_notice

    where = config.placement()
    notes = []
    if (notice := precision_notice(config.dtype, config.autocast, where.device)) is not None:
        notes.append(notice)
    if where.device.type == "cpu" and config.learner_world_size > 1:
        notes.append(f"cpu: the learner's parts of all {config.learner_world_size} ranks")
    for device in plan.devices:
        if device.tight:
            need = max(map(device.peak, PHASES))
            notes.append(
                f"{device.memory.name}: the run needs about {gib(need)}, more than the "
                f"{gib(device.memory.free)} available now: it may swap or be killed (close "
                "other programs, or lower concurrency, max_len or the engine's KV cache)"
            )
    if not any(d.memory.is_gpu for d in plan.devices):
        return tuple(notes)
    if config.colocate == "auto":
        how = f"on: the engine sleeps (level {config.sleep_level}) while the learner trains"
        notes.append(f"colocate = 'auto': {how if plan.colocate else 'off'}")
    if plan.planned_utilization:
        notes.append(f"the engine's gpu_memory_utilization: {plan.engine_utilization} (planned)")
    if config.micro_batch_tokens == "auto":
        activations = plan.micro_batch_tokens * plan.activation_bytes_per_token
        notes.append(
            f"micro_batch_tokens = 'auto': {plan.micro_batch_tokens:,} ({gib(activations)} "
            "of activations)"
        )
    return tuple(notes)


def predicted_learner_peak(
    config: TrainConfig, shape: Shape, micro_batch_tokens: int, critic: Shape | None = None
) -> int:
    """Bytes one learner rank's step should peak at in torch's allocator
    (``torch.cuda.max_memory_allocated``) with ``micro_batch_tokens`` per micro-batch: its
    parts in the learning phase, without CUDA contexts, other processes or an engine."""
    learn = request_of(config, shape, critic).learning
    return sum(p.learning for p in learner_parts(shape, learn, micro_batch_tokens))
