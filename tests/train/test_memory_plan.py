"""The memory plan (``loomrl.train.memory_plan``) on simulated GPUs: 24, 40, 80 and 141 GB
cards, Qwen2 0.5B, 1.5B and 7B shapes, colocated or not, one or four learner ranks. Each
plan is checked part by part against the hand computation written here from the shape;
the default one-GPU run is colocated and fits at 0.5B and 1.5B on an 80 GB card; the
engine's share and the micro-batch budget come from the plan; a user's share wins and is
checked."""

from __future__ import annotations

import pytest
from simulated_gpus import GB, QWEN2, model_dir, qwen2_dir, simulate_gpus

from loomrl.train.config import TrainConfig
from loomrl.train.memory_parts import (
    CONTEXT,
    ENGINE_GRAPHS,
    ENGINE_MARGIN,
    ENGINE_RUNTIME,
    HEAD_COPIES,
)
from loomrl.train.memory_plan import SLACK, MemoryPlanError, plan_memory, predicted_learner_peak
from loomrl.train.model_shape import Shape

GiB = 2**30
CARDS = (24, 40, 80, 141)
SIZES = ("0.5b", "1.5b", "7b")
LAYOUTS = (("colocated", 1), ("apart", 1), ("sharded", 4))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each size's model directory and its shape as read from it (once per module)."""
    root = tmp_path_factory.mktemp("qwen2")
    dirs = {size: qwen2_dir(root, size) for size in SIZES}
    return {size: (path, Shape.of(path)) for size, path in dirs.items()}


def parameters(size: str) -> tuple[int, int]:
    """(all parameters, one decoder layer's) of a Qwen2 shape, counted by hand: q, k, v
    with biases, o, the MLP's three matrices, two norms; the embedding, the final norm and
    an untied head."""
    s = QWEN2[size]
    h, i, layers, v = (
        s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"],
    )  # fmt: skip
    kv = s["num_key_value_heads"] * h // s["num_attention_heads"]
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    head = 0 if s["tie_word_embeddings"] else v * h
    return v * h + layers * layer + h + head, layer


def by_hand(size: str, total: int, layout: str, world: int) -> dict:
    """The plan of the default config (fp32 weights, bf16 autocast, no reference or
    critic, concurrency 64 x max_len 512) for one layout: cuda:0's parts per phase,
    another rank's peaks, the budget, the engine's share and whether it fits."""
    s = QWEN2[size]
    h, i, layers, v = (
        s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"],
    )  # fmt: skip
    kv_dim = s["num_key_value_heads"] * h // s["num_attention_heads"]
    p, layer = parameters(size)
    colocated = layout == "colocated"
    slack = int(SLACK * total)
    weights, grads, moments = 4 * p // world, 4 * p // world, 8 * p // world
    # One rank: autocast's bf16 copies of every layer and of the head; several: FSDP's
    # two gathered bf16 layers and its root (embedding, head, final norm).
    copies = 2 * (layers * layer + v * h) if world == 1 else (2 * layer + p - layers * layer) * 2
    head = 1024 * v * 4 * HEAD_COPIES
    per_token = layers * ((10 * h + 4 * i) * 2 + 6 * h * 4)
    # The engine: bf16 weights, profiled buffers, graphs; KV for 64 sequences of 512.
    e_weights = 2 * p
    buffers = 2048 * (4 * h + 3 * i) * 2 + 3 * 128 * v * 4 + ENGINE_RUNTIME
    fixed = e_weights + buffers + ENGINE_GRAPHS
    one = 512 * 2 * layers * kv_dim * 2
    learner_rollout = weights + (0 if colocated else grads) + moments + CONTEXT
    learner_fixed = weights + grads + moments + copies + head + CONTEXT  # but activations
    if colocated:  # the KV cache takes what the learner leaves while the engine generates
        room = total - slack - learner_rollout - CONTEXT - fixed
    else:  # ... what it leaves at its peak with the smallest micro-batch
        room = total - slack - learner_fixed - 256 * per_token - CONTEXT - fixed
    kv = max(one, min(64 * one + ENGINE_MARGIN, room))
    share = (fixed + kv) * 10_000 // total * total // 10_000
    awake = 0 if colocated else 1
    engine_learning = share * awake + CONTEXT
    lefts = [total - slack - learner_fixed - engine_learning]
    if world > 1:
        lefts.append(total - slack - learner_fixed)
    tokens = max(256, min(65536, max(0, min(lefts)) // per_token // 256 * 256))
    activations = tokens * per_token
    parts = {
        "used before the run": (0, 0), "allocator slack": (slack, slack),
        "policy weights": (weights, weights), "policy gradients": (grads * awake, grads),
        "AdamW moments": (moments, moments),
        ("autocast bf16 copies" if world == 1 else "FSDP gathered layers"): (0, copies),
        "head chunk reserve": (0, head), "activations": (0, activations),
        "learner CUDA context": (CONTEXT, CONTEXT),
        "engine weights": (e_weights, e_weights * awake),
        "engine activations and buffers": (buffers, buffers * awake),
        "engine CUDA graphs": (ENGINE_GRAPHS, ENGINE_GRAPHS * awake),
        "engine KV cache": (share - fixed, (share - fixed) * awake),
        "engine CUDA context": (CONTEXT, CONTEXT),
    }  # fmt: skip
    peaks = [sum(r for r, _ in parts.values()), sum(lr for _, lr in parts.values())]
    other = [slack + weights + grads + moments + CONTEXT, slack + learner_fixed + activations]
    fits = max(peaks) <= total and (world == 1 or max(other) <= total)
    host = {"engine weights, asleep (level 1)": (0, e_weights)} if colocated else {}
    return {
        "parts": parts, "peaks": peaks, "other": other, "tokens": tokens, "fits": fits,
        "utilization": round(share / total, 4), "colocate": colocated, "host": host,
    }  # fmt: skip


def config_for(path, layout: str, world: int, **extra) -> TrainConfig:
    colocate = {"apart": False}.get(layout, "auto")  # auto: on with one GPU, off with four
    return TrainConfig(model=str(path), colocate=colocate, learner_world_size=world, **extra)


def test_the_shapes_are_read_from_the_config_as_counted_by_hand(models):
    assert parameters("0.5b")[0] == 494_032_768  # Qwen2-0.5B's published count
    for size, (_, shape) in models.items():
        assert (shape.parameters, shape.layer_parameters) == parameters(size)
        s = QWEN2[size]
        h, v = s["hidden_size"], s["vocab_size"]
        assert shape.head_parameters == (0 if s["tie_word_embeddings"] else v * h)
        assert shape.kv_dim == s["num_key_value_heads"] * h // s["num_attention_heads"]


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("layout", "world"), LAYOUTS)
def test_each_plan_is_the_hand_computation(monkeypatch, models, card, size, layout, world):
    total = card * GB
    simulate_gpus(monkeypatch, total, count=world)
    path, shape = models[size]
    plan = plan_memory(config_for(path, layout, world), shape)
    want = by_hand(size, total, layout, world)
    cuda0 = plan.devices[0]
    assert cuda0.memory.name == "cuda:0"
    assert {p.name: (p.rollout, p.learning) for p in cuda0.parts} == want["parts"]
    assert [cuda0.peak("rollout"), cuda0.peak("learning")] == want["peaks"]
    ranks = [d for d in plan.devices if d.memory.is_gpu]
    assert [d.memory.name for d in ranks] == [f"cuda:{r}" for r in range(world)]
    for other in ranks[1:]:
        assert [other.peak("rollout"), other.peak("learning")] == want["other"]
    host = {p.name: (p.rollout, p.learning) for d in plan.devices[world:] for p in d.parts}
    assert {k: v for k, v in host.items() if "weights" in k} == want["host"]
    assert plan.micro_batch_tokens == want["tokens"]
    assert plan.engine_utilization == want["utilization"]
    assert plan.colocate is want["colocate"]
    assert plan.fits is want["fits"]
    if not want["fits"]:
        with pytest.raises(MemoryPlanError, match=r"^cuda:\d: .* more than its .*: set .*"):
            plan.check()


@pytest.mark.parametrize("size", ["0.5b", "1.5b"])
def test_the_default_one_gpu_run_is_colocated_and_fits_an_80_gb_card(monkeypatch, models, size):
    simulate_gpus(monkeypatch, 80 * GB)
    path, shape = models[size]
    plan = plan_memory(TrainConfig(model=str(path)), shape)
    assert plan.colocate and plan.fits, plan.refusal
    assert 0 < plan.engine_utilization < 0.2  # never vLLM's 0.92 beside the learner
    assert plan.engine_args() == {"gpu_memory_utilization": plan.engine_utilization}
    assert plan.micro_batch_tokens >= 8192


def test_a_7b_run_on_a_24_gb_card_is_refused_naming_the_part_and_the_ways_out(monkeypatch, models):
    simulate_gpus(monkeypatch, 24 * GB)
    path, shape = models["7b"]
    plan = plan_memory(TrainConfig(model=str(path)), shape)
    assert not plan.fits
    message = plan.refusal
    assert message.startswith("cuda:0: AdamW moments (56.7 GiB), policy weights (28.4 GiB)")
    assert "more than its 22.4 GiB: set dtype = 'bfloat16', lora = { r = 16 }" in message
    assert "\n" not in message
    # Both phases overflow; the refusal names the larger peak (what has to be cut).
    cuda0 = plan.devices[0]
    assert cuda0.peak("rollout") < cuda0.peak("learning")
    assert f"need {cuda0.peak('learning') / GiB:.1f} GiB while learning," in message


def test_the_ways_out_offer_colocation_and_more_ranks_where_they_exist(monkeypatch, models):
    simulate_gpus(monkeypatch, 24 * GB, count=2)
    path, shape = models["1.5b"]
    plan = plan_memory(TrainConfig(model=str(path), kl_coef=0.05, colocate=False), shape)
    assert not plan.fits
    assert "set colocate = true, learner_world_size = 2, dtype = 'bfloat16'" in plan.refusal
    assert "reference (KL)" in {p.name for p in plan.devices[0].parts}


def test_a_users_gpu_memory_utilization_wins_and_is_checked(monkeypatch, models):
    simulate_gpus(monkeypatch, 80 * GB)
    path, shape = models["0.5b"]
    asked = TrainConfig(model=str(path), engine_args={"gpu_memory_utilization": 0.3})
    plan = plan_memory(asked, shape)
    assert plan.fits and plan.engine_utilization == 0.3 and plan.engine_args() == {}
    kv = {p.name: p.rollout for p in plan.devices[0].parts}["engine KV cache"]
    assert kv == int(0.3 * 80 * GB) - sum(
        p.rollout for p in plan.devices[0].parts
        if p.name in ("engine weights", "engine activations and buffers", "engine CUDA graphs")
    )  # fmt: skip
    greedy = TrainConfig(
        model=str(path), colocate=False, engine_args={"gpu_memory_utilization": 0.92}
    )
    refused = plan_memory(greedy, shape).refusal
    assert refused.startswith("cuda:0: engine KV cache")
    assert "no engine_args.gpu_memory_utilization (the plan picks one)" in refused
    tiny = TrainConfig(model=str(path), engine_args={"gpu_memory_utilization": 0.01})
    assert plan_memory(tiny, shape).refusal.startswith(
        "engine_args.gpu_memory_utilization = 0.01 gives vLLM 0.7 GiB of cuda:0 (74.5 GiB): "
    )


def test_other_processes_memory_counts_against_the_card(monkeypatch, models):
    path, shape = models["1.5b"]
    simulate_gpus(monkeypatch, 80 * GB)
    empty = plan_memory(TrainConfig(model=str(path)), shape)
    simulate_gpus(monkeypatch, 80 * GB, free=50 * GB)
    busy = plan_memory(TrainConfig(model=str(path)), shape)
    used = {p.name: p.learning for p in busy.devices[0].parts}["used before the run"]
    assert used == 30 * GB
    assert busy.micro_batch_tokens < empty.micro_batch_tokens


def test_a_set_budget_is_checked_against_the_card(monkeypatch, models):
    simulate_gpus(monkeypatch, 24 * GB)
    path, shape = models["0.5b"]
    assert plan_memory(TrainConfig(model=str(path), micro_batch_tokens=4096), shape).fits
    plan = plan_memory(TrainConfig(model=str(path), micro_batch_tokens=65536), shape)
    assert plan.refusal.startswith("cuda:0: activations")
    assert "micro_batch_tokens = 'auto'" in plan.refusal


def test_the_predicted_learner_peak_is_the_learning_phase_without_engine_or_context(
    monkeypatch, models
):
    simulate_gpus(monkeypatch, 80 * GB)
    path, shape = models["0.5b"]
    config = TrainConfig(model=str(path))
    p, layer = parameters("0.5b")
    h, i, v = 896, 4864, 151936
    per_token = 24 * ((10 * h + 4 * i) * 2 + 6 * h * 4)
    expected = 16 * p + 2 * (24 * layer + v * h) + 1024 * v * 12 + 4096 * per_token
    assert predicted_learner_peak(config, shape, 4096) == expected


def test_ranks_beyond_this_hosts_gpus_are_planned_like_its_first(monkeypatch, models):
    simulate_gpus(monkeypatch, 80 * GB, count=2, free=70 * GB)
    path, shape = models["1.5b"]
    plan = plan_memory(TrainConfig(model=str(path), learner_world_size=4), shape)
    names = [d.memory.name for d in plan.devices if d.memory.is_gpu]
    assert names == ["cuda:0", "cuda:1", "cuda (rank 2)", "cuda (rank 3)"]
    far = plan.devices[2].memory
    assert (far.total, far.free) == (80 * GB, 80 * GB)  # another host's card, not measured


def test_qwen2_0_5b_on_an_80_gb_card_in_numbers(monkeypatch, models):
    """The documented figures (docs/training.md), worked out with the numbers written out:
    P = 494,032,768 parameters, 14,912,384 a layer, h 896, i 4,864, 24 layers, V 151,936,
    128 KV values per token and layer; an 80e9-byte card."""
    simulate_gpus(monkeypatch, 80 * GB)
    path, shape = models["0.5b"]
    plan = plan_memory(TrainConfig(model=str(path)), shape)
    # The engine: bf16 weights 988,065,536; buffers 2048 x (3584 + 14592) x 2 = 74,448,896,
    # sampler 3 x 128 x 151,936 x 4 = 233,373,696, runtime 268,435,456; graphs 536,870,912:
    # 2,101,194,496 fixed. KV: 64 x 512 tokens x 12,288 bytes = 402,653,184, + 1 GiB.
    # (2,101,194,496 + 1,476,395,008) / 80e9 = 0.04472 -> 0.0447.
    assert plan.engine_utilization == 0.0447
    # Learning: slack 8e9, weights and gradients 1,976,131,072 each, moments 3,952,262,144,
    # bf16 copies 2 x (24 x 14,912,384 + 151,936 x 896) = 988,063,744, head reserve
    # 1024 x 151,936 x 12 = 1,866,989,568, two CUDA contexts 1,073,741,824: 19,833,319,424.
    # 60,166,680,576 left / 1,880,064 bytes a token (24 x (28,416 x 2 + 5,376 x 4)) = 32,002.
    assert plan.micro_batch_tokens == 32_000
    assert cuda0_learning(plan) == 19_833_319_424 + 32_000 * 1_880_064


def cuda0_learning(plan) -> int:
    return sum(p.learning for p in plan.devices[0].parts)


def test_an_engine_alone_on_its_gpu_keeps_vllms_share_or_what_is_free(monkeypatch, models):
    """A CPU learner on a GPU host: the engine is alone on cuda:0, where the learner's
    allocator slack does not apply (vLLM's 0.92 plus 10% would never fit)."""
    path, shape = models["0.5b"]
    cpu_learner = TrainConfig(model=str(path), device="cpu")
    simulate_gpus(monkeypatch, 80 * GB)
    plan = plan_memory(cpu_learner, shape)
    assert plan.fits, plan.refusal
    assert plan.engine_utilization == 0.92 and plan.engine_args() == {}  # vLLM's own
    cuda0 = {p.name: p.rollout for d in plan.devices if d.memory.is_gpu for p in d.parts}
    assert "allocator slack" not in cuda0
    assert sum(cuda0.values()) == int(0.92 * 80 * GB) + CONTEXT
    simulate_gpus(monkeypatch, 80 * GB, free=50 * GB)  # vLLM refuses 0.92 when 50 GB is free
    busy = plan_memory(cpu_learner, shape)
    # (50e9 - 536,870,912) / 80e9 = 0.61829 -> 0.6182
    assert busy.fits and busy.engine_args() == {"gpu_memory_utilization": 0.6182}


def test_colocation_is_offered_only_where_it_could_share_the_gpu(monkeypatch, models):
    simulate_gpus(monkeypatch, 24 * GB)
    path, shape = models["1.5b"]
    for cannot in ({"device": "cpu", "micro_batch_tokens": 65536}, {"producer": "async"}):
        config = TrainConfig(model=str(path), kl_coef=0.05, colocate=False, **cannot)
        refusal = plan_memory(config, shape).refusal
        assert refusal is not None and "colocate = true" not in refusal, cannot


@pytest.mark.parametrize(
    ("name", "value"),
    [("gpu_memory_utilization", "0.3"), ("gpu_memory_utilization", 1.5),
     ("gpu_memory_utilization", True), ("max_num_seqs", "many"), ("max_num_batched_tokens", 0)],
)  # fmt: skip
def test_engine_args_the_plan_reads_are_refused_in_one_line_when_not_numbers(
    monkeypatch, models, name, value
):
    simulate_gpus(monkeypatch, 10**6)  # small: a string share must not become a huge string
    path, shape = models["0.5b"]
    config = TrainConfig(model=str(path), engine_args={name: value})
    with pytest.raises(ValueError, match=rf"^engine_args\.{name} = {value!r}: vLLM takes "):
        plan_memory(config, shape)


def test_a_model_without_attention_has_no_kv_cache_to_plan(tmp_path):
    mamba = model_dir(tmp_path / "mamba", {
        "architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100,
    })  # fmt: skip
    shape = Shape.of(mamba)
    assert (shape.layers, shape.hidden, shape.kv_dim) == (2, 64, 0)
    plan = plan_memory(TrainConfig(model=str(mamba)))
    assert plan.micro_batch_tokens >= 256


def test_a_cards_free_memory_is_read_through_nvml_where_it_answers(monkeypatch):
    """NVML makes no CUDA context on a card this process will not use; without it the
    CUDA runtime answers (simulated_gpus has no NVML)."""
    import torch

    from loomrl import hardware

    simulate_gpus(monkeypatch, 80 * GB, free=70 * GB)
    assert hardware.gpu_memory(0) == (70 * GB, 80 * GB)  # cudaMemGetInfo
    monkeypatch.setattr(torch.cuda, "device_memory_used", lambda device=None: 30 * GB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: pytest.fail("no NVML?"))
    assert hardware.gpu_memory(0) == (50 * GB, 80 * GB)
