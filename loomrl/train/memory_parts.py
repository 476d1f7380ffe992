"""The parts of a training run's memory, each in bytes for two phases: while the engine
generates (``rollout``) and at the learner's peak (``learning``). Pure arithmetic on a
model's shape (``loomrl.train.model_shape``); ``loomrl.train.memory_plan`` places the parts
on devices and checks that they fit.

The learner, per rank (1/N of each on N sharded ranks):

- weights ``P w`` (``w``: 4 bytes in fp32, 2 in bf16); gradients ``T w`` and AdamW's two
  moments ``2 T w`` for the ``T`` parameters it trains (all, or LoRA's fp32 adapters). The
  moments exist from the first optimizer step on and stay through the rollouts; the
  gradients stay until the next step's ``zero_grad`` unless the run frees them before the
  engine wakes (colocated runs do);
- the reference (KL) ``P w``; the critic: its backbone and fp32 value head, their gradients
  and moments;
- under bf16 autocast with fp32 weights, the bf16 copies autograd keeps of every layer's
  matmul weights until backward, ``2 (L p + V h)`` bytes (``p``: one layer's parameters;
  one layer's with gradient checkpointing); with several ranks, FSDP's gathered units
  instead: two decoder layers and the root (embedding, head) in the compute dtype;
- the chunked head's reserve, ``rows × V × 4 × 3`` (a chunk's logits, probabilities and
  their gradient, ``loomrl.experience.token_scores``);
- the activations of one micro-batch, per token and layer: ``(10 h + 4 i)`` values in the
  compute dtype (the projections' inputs and outputs, attention's, the MLP's; ``h`` hidden,
  ``i`` the MLP's size) and ``6 h`` in the weights' dtype (the residual stream and the two
  RMS norms, float32 under autocast); with gradient checkpointing one residual ``h`` per
  layer plus one layer recomputed at a time.

The in-process vLLM engine (vLLM 0.32, ``vllm/v1/worker/gpu_worker.py``): it takes
``gpu_memory_utilization × total`` of the GPU, in which its weights, its profiled
activations and buffers and its CUDA graphs are counted first and the KV cache gets the
rest; its CUDA context lies outside that share. Asleep (sleep mode's ``CuMemAllocator``),
every pool it allocated is unmapped at both levels: level 1 copies the weights (and the
graphs) to pinned host memory, level 2 drops the weights; only the context stays on the GPU.
Figures not measured on a GPU here are named constants below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loomrl.experience.token_scores import CHUNK_ROWS
from loomrl.train.model_shape import Shape

GiB = 2**30
CONTEXT = GiB // 2  # a process's CUDA context (driver state, kernels): outside torch's allocator
HEAD_COPIES = 3  # the head's chunk: logits, probabilities, their gradient (float32)
ENGINE_GRAPHS = GiB // 2  # vLLM's CUDA graphs (it profiles them at start); none when eager
ENGINE_RUNTIME = GiB // 4  # vLLM's memory outside torch after its start (cuBLAS, sampler)
ENGINE_MARGIN = GiB  # KV headroom: what vLLM measures beyond this plan comes out of it first
ENGINE_SEQS, ENGINE_TOKENS = 128, 2048  # AsyncLLM's max_num_seqs / max_num_batched_tokens


@dataclass(frozen=True)
class Part:
    """One part of a device's memory, in bytes, in each phase."""

    name: str
    rollout: int
    learning: int

    def at(self, phase: str) -> int:
        return self.rollout if phase == "rollout" else self.learning


@dataclass(frozen=True)
class Learning:
    """What the learner's parts depend on, resolved from a run's config."""

    world: int = 1  # learner ranks (FSDP2 shards everything 1/world)
    weight_bytes: int = 4  # 4: fp32 weights, 2: bf16
    compute_bytes: int = 2  # activations and matmuls: 2 under bf16 (autocast or weights)
    autocast_copies: bool = True  # fp32 weights under bf16 autocast
    checkpointing: bool = False
    lora_parameters: int = 0  # > 0: LoRA adapters (fp32) are all that trains
    reference: bool = False  # a reference model is loaded (KL without LoRA)
    critic: Shape | None = None  # the critic's model (its backbone is what it holds)
    grads_freed: bool = False  # gradients freed before the engine wakes (colocated runs)


@dataclass(frozen=True)
class Serving:
    """What the in-process engine's parts depend on."""

    count: int = 1  # in-process engines (replicas) on the device
    weight_bytes: int = 2  # its serving dtype's
    graphs: bool = True  # CUDA graphs captured (not enforce_eager)
    seqs: int = ENGINE_SEQS  # max_num_seqs
    batched_tokens: int = ENGINE_TOKENS  # max_num_batched_tokens
    max_len: int = 512  # one sequence's tokens
    concurrency: int = 64  # trajectories in flight
    sleeps: bool = False  # colocated: asleep while the learner trains
    sleep_level: int = 1


def activation_bytes_per_token(
    shape: Shape, compute_bytes: int, checkpointing: bool, residual_bytes: int | None = None
) -> int:
    """Bytes one micro-batch token keeps for backward (see the module docstring);
    ``residual_bytes``: the weights' dtype's (default the compute dtype's)."""
    residual = compute_bytes if residual_bytes is None else residual_bytes
    h, i = shape.hidden, shape.intermediate
    layer = (10 * h + 4 * i) * compute_bytes + 6 * h * residual
    if checkpointing:
        return shape.layers * h * residual + layer
    return shape.layers * layer


def head_reserve(shape: Shape) -> int:
    """The chunked head's working memory: ``CHUNK_ROWS × V`` float32, three times."""
    return CHUNK_ROWS * shape.vocab * 4 * HEAD_COPIES


def lora_parameters(shape: Shape, r: int, targets: Sequence[str]) -> int:
    """LoRA's adapter parameters: ``r (in + out)`` for each targeted linear of every layer
    (``all-linear``: every linear of the decoder layers)."""
    every = "all-linear" in targets
    per_layer = sum(r * (i + o) for name, i, o in shape.linears if every or name in targets)
    return per_layer * shape.layers


def learner_parts(shape: Shape, learn: Learning, tokens: int) -> list[Part]:
    """One learner rank's parts, with ``tokens`` per micro-batch (a list: shown in order)."""
    n, w = learn.world, learn.weight_bytes
    weights = shape.parameters * w // n
    trained = learn.lora_parameters * 4 if learn.lora_parameters else shape.parameters * w
    weights += learn.lora_parameters * 4 // n
    grads, moments = trained // n, 2 * trained // n
    parts = [
        Part("policy weights", weights, weights),
        Part("policy gradients", 0 if learn.grads_freed else grads, grads),
        Part("AdamW moments", moments, moments),
    ]
    if learn.reference:
        parts.append(Part("reference (KL)", weights, weights))
    if learn.critic is not None:
        c = learn.critic
        held = (c.backbone_parameters * w + (c.hidden + 1) * 4) // n  # the value head is fp32
        parts.append(Part("critic and its AdamW", held * (3 if learn.grads_freed else 4), held * 4))
    copies = compute_copies(shape, learn)
    if copies:
        name = "FSDP gathered layers" if n > 1 else "autocast bf16 copies"
        parts.append(Part(name, 0, copies))
    per_token = activation_bytes_per_token(
        shape, learn.compute_bytes, learn.checkpointing, learn.weight_bytes
    )
    parts.append(Part("head chunk reserve", 0, head_reserve(shape)))
    parts.append(Part("activations", 0, tokens * per_token))
    return parts


def compute_copies(shape: Shape, learn: Learning) -> int:
    """Weights held in the compute dtype beside the weights themselves during a step: one
    process under bf16 autocast keeps each layer's bf16 copy for backward (one layer at a
    time with checkpointing) and the head's; FSDP2 gathers two layers and the root."""
    head = shape.vocab * shape.hidden
    if learn.world > 1:
        root = shape.parameters - shape.layers * shape.layer_parameters
        return (2 * shape.layer_parameters + root) * learn.compute_bytes
    if not learn.autocast_copies:
        return 0
    layers = 1 if learn.checkpointing else shape.layers
    return 2 * (layers * shape.layer_parameters + head)


def kv_bytes_per_token(shape: Shape, kv_bytes: int) -> int:
    """K and V of every layer for one token."""
    return 2 * shape.layers * shape.kv_dim * kv_bytes


def engine_fixed(shape: Shape, serve: Serving) -> tuple[int, int, int]:
    """One engine's (weights, activations and buffers, CUDA graphs): what vLLM counts
    before its KV cache. Its profiled activations: ``batched_tokens × (4 h + 3 i)`` values
    (a layer's hidden states, QKV, attention output, MLP), the sampler's ``seqs × V``
    float32 logits three times (logits, probabilities, logprobs), and its runtime."""
    weights = shape.parameters * serve.weight_bytes
    activations = serve.batched_tokens * (4 * shape.hidden + 3 * shape.intermediate)
    buffers = activations * serve.weight_bytes + 3 * serve.seqs * shape.vocab * 4 + ENGINE_RUNTIME
    return weights, buffers, ENGINE_GRAPHS if serve.graphs else 0


def kv_need(shape: Shape, serve: Serving) -> tuple[int, int]:
    """(bytes for every trajectory in flight at full length, bytes for one sequence): the
    KV cache the engine wants, and the least vLLM starts with."""
    per_token = kv_bytes_per_token(shape, serve.weight_bytes)
    one = serve.max_len * per_token
    return min(serve.concurrency, serve.seqs) * one, one


def engine_parts(shape: Shape, serve: Serving, share: int, context: int = CONTEXT) -> list[Part]:
    """The in-process engines' parts on their device, each taking ``share`` bytes
    (``gpu_memory_utilization × total``) besides its CUDA ``context`` (0 on a CPU); asleep
    they keep only the context."""
    weights, buffers, graphs = engine_fixed(shape, serve)
    kv = max(0, share - weights - buffers - graphs)
    k, awake = serve.count, 0 if serve.sleeps else 1
    return [
        Part("engine weights", k * weights, k * weights * awake),
        Part("engine activations and buffers", k * buffers, k * buffers * awake),
        Part("engine CUDA graphs", k * graphs, k * graphs * awake),
        Part("engine KV cache", k * kv, k * kv * awake),
        *([Part("engine CUDA context", k * context, k * context)] if context else []),
    ]


def asleep_on_host(shape: Shape, serve: Serving) -> list[Part]:
    """What a sleeping engine keeps in pinned host memory: its weights at level 1 (level 2
    drops them), its CUDA graphs at both."""
    weights, _, graphs = engine_fixed(shape, serve)
    kept = weights if serve.sleep_level == 1 else 0
    return [
        Part(f"engine weights, asleep (level {serve.sleep_level})", 0, kept),
        Part("engine CUDA graphs, asleep", 0, graphs),
    ]
