"""LoRA training (``TrainConfig.lora``): low-rank adapters on a frozen base model, with peft.

The learner trains ``W + (α/r)·B·A`` with ``W`` frozen: only ``A`` and ``B`` have gradients, so
only they reach the optimizer (``Learner`` takes the parameters that require grad). Three
things differ from full fine-tuning, all here:

- **reference model**: the base itself, run with the adapters switched off (peft's
  ``disable_adapter`` context, ``adapters_off``); no second copy of the weights is loaded.
- **weight sync**: the engine gets plain HF-named merged weights ``W + ΔW``, computed on the
  fly (``merged_state_dict``) without touching the trained model, so vLLM needs no LoRA
  support and serves at full speed; or, with ``sync = "adapter"``, the adapter alone
  (``adapter_of``), which the engine loads as a vLLM LoRA adapter.
- **checkpoints** hold the adapter (``adapter/``: peft's ``adapter_config.json`` and
  ``adapter_model.safetensors``, plus the tokenizer), not the model: a few MB instead of
  hundreds. Serve one as adapter + base (peft's ``PeftModel.from_pretrained``, or vLLM's
  ``enable_lora``) or export a merged HF directory with ``export_merged``.

``peft`` is an optional dependency (``loomrl[lora]``): it is imported only when LoRA is used.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from loomrl.engines.lora_adapter import Adapter

ALL_LINEAR = "all-linear"


class LoraConfig(BaseModel):
    """Low-rank adapters instead of full fine-tuning (peft's ``LoraConfig``)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: float = Field(
        32.0, gt=0, allow_inf_nan=False, description="scale: the update is (alpha / r)·B·A"
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    targets: list[str] = Field(
        default_factory=lambda: [ALL_LINEAR],
        min_length=1,
        description="names of the linear modules to adapt (e.g. q_proj, v_proj), or "
        "'all-linear' (every linear layer but the output head)",
    )
    sync: Literal["merged", "adapter"] = Field(
        "merged",
        description="what a weight sync sends: the merged weights (vLLM decodes at full "
        "speed) or the adapter (a vLLM LoRA adapter: a far cheaper sync, slower decoding)",
    )


class LoraError(ValueError):
    """A LoRA configuration the model cannot take, or an adapter directory that is unusable."""


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last-part names of the model's linear layers (what ``targets`` names)."""
    return sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )


def check_targets(model: torch.nn.Module, config: LoraConfig) -> None:
    """Raise ``LoraError`` for a target the model has no linear layer of (listing the
    names it has), or the output head of a model whose head is tied to its embeddings
    (a merged head would no longer equal the embeddings it shares weights with)."""
    if config.targets == [ALL_LINEAR]:
        return
    names = linear_names(model)
    unknown = [t for t in config.targets if t not in names]
    if unknown:
        raise LoraError(
            f"lora.targets {unknown} name no linear module of this model; its linear "
            f"modules are: {', '.join(names)} (or 'all-linear')"
        )
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    for target in config.targets:
        if tied and head is not None and target == _name_of(model, head):
            raise LoraError(
                f"lora.targets: {target!r} is the output head, tied to the input embeddings "
                "in this model; adapt the other layers"
            )


def _name_of(model: torch.nn.Module, module: torch.nn.Module) -> str | None:
    for name, m in model.named_modules():
        if m is module:
            return name.rsplit(".", 1)[-1]
    return None


def attach(
    model: torch.nn.Module, config: LoraConfig, adapter_dir: Path | None = None
) -> torch.nn.Module:
    """``model`` wrapped with fresh adapters (``B = 0``: it starts equal to the base), or
    with the trainable adapter saved in ``adapter_dir``; the base weights are frozen."""
    try:
        import peft
    except ImportError as exc:
        raise LoraError(
            "lora needs the peft package: pip install 'loomrl[lora]' (or pip install peft)"
        ) from exc
    check_targets(model, config)
    if adapter_dir is not None:
        if not (adapter_dir / "adapter_config.json").is_file():
            raise LoraError(f"{adapter_dir} holds no adapter_config.json: not a LoRA adapter")
        return peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
    targets: str | list[str] = (
        ALL_LINEAR if config.targets == [ALL_LINEAR] else list(config.targets)
    )
    spec = peft.LoraConfig(
        r=config.r, lora_alpha=config.alpha, lora_dropout=config.dropout,
        target_modules=targets, bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    return peft.get_peft_model(model, spec)


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft model (never imports peft: if it is not loaded, no)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (a tied tensor counted once)."""
    seen: dict[int, torch.nn.Parameter] = {id(p): p for p in model.parameters()}
    trainable = sum(p.numel() for p in seen.values() if p.requires_grad)
    return trainable, sum(p.numel() for p in seen.values())


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The base model's state dict under its own (HF) names with every active adapter
    merged in, ``W + (α/r)·B·A``; the model is not modified (new tensors for the adapted
    weights, the others shared)."""
    base = model.get_base_model()  # type: ignore[operator]
    deltas: dict[str, Tensor] = {}
    for name, module in base.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if lora_a is None or not hasattr(module, "base_layer") or module.merged:
            continue
        if module.disable_adapters:
            continue
        active = [a for a in module.active_adapters if a in lora_a]
        if active:
            deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in active)
    merged: dict[str, Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        merged[key] = value + deltas[key].to(value.dtype) if key in deltas else value
    return merged


def adapter_of(model: torch.nn.Module) -> Adapter:
    """The peft model's adapter as a sync sends it: its config and host copies of its
    tensors under the names peft saves them with (what vLLM's LoRA loader reads)."""
    from peft import get_peft_model_state_dict

    config = model.peft_config["default"].to_dict()  # type: ignore[operator, index]
    tensors = get_peft_model_state_dict(model)
    return Adapter(
        json.loads(json.dumps(config, default=sorted)),  # sets (target_modules) as lists
        {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()},
    )


def sync_weights(
    model: torch.nn.Module, on_host: bool = True, dtype: torch.dtype | None = None
) -> dict[str, Tensor]:
    """What a weight sync sends the engine: the merged weights of a LoRA model, else the
    model's own state dict; on the host (a learner on a GPU copies them once here, the
    engine's loaders read host memory), or where they are for vLLM's GPU backends (NCCL
    and IPC send from the learner's GPU). ``dtype``: the engines' (e.g. bf16 beside fp32
    master weights): a GPU's tensors are cast to it on the GPU, one at a time, before
    their host copy, so half the bytes cross and the device holds one cast tensor at a
    time; host tensors are left to the senders, which cast them bucket by bucket."""
    weights = merged_state_dict(model) if is_lora(model) else model.state_dict()
    if not on_host:
        return {k: v.detach() for k, v in weights.items()}
    return {k: _to_host(v.detach(), dtype) for k, v in weights.items()}


def _to_host(tensor: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``tensor`` on the host, cast to ``dtype`` first on its own device when it lives on
    an accelerator (the cast copy is freed as soon as the host has it)."""
    if dtype is not None and tensor.device.type != "cpu" and tensor.is_floating_point():
        tensor = tensor.to(dtype=dtype)
    return tensor.cpu()


class AdaptersOff:
    """The base model of a peft model as a reference model: calls run with the adapters
    disabled (peft's ``disable_adapter``), so the reference costs no second copy. It has
    what ``Learner`` and ``compute_logprobs`` use: ``__call__``/``forward``,
    ``get_base_model``, ``parameters``,
    ``training``, ``train``, ``eval``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.disable_adapter():  # type: ignore[operator]
            return self.model(*args, **kwargs)

    forward = __call__

    def get_base_model(self) -> torch.nn.Module:
        return self.model.get_base_model()  # type: ignore[operator]

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    @property
    def training(self) -> bool:
        return self.model.training

    def train(self, mode: bool = True) -> AdaptersOff:
        self.model.train(mode)
        return self

    def eval(self) -> AdaptersOff:
        return self.train(False)


def adapters_off(model: torch.nn.Module) -> Any:
    """A reference model that is ``model``'s base (see ``AdaptersOff``)."""
    return AdaptersOff(model)


def export_merged(adapter_dir: Path, out: Path, base: str | Path | None = None) -> Path:
    """Write a plain HF model directory (weights merged, tokenizer copied) that vLLM and
    transformers load as is, from a checkpoint's ``adapter/`` and its base model: ``base``
    (a model spec or directory; default: the one the adapter records)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from loomrl.models import resolve

    config_path = adapter_dir / "adapter_config.json"
    if not config_path.is_file():
        raise LoraError(f"{adapter_dir} holds no adapter_config.json: not a LoRA adapter")
    base = base or json.loads(config_path.read_text())["base_model_name_or_path"]
    base_dir = resolve(str(base))
    dtype = json.loads((base_dir / "config.json").read_text()).get("dtype") or "float32"
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    merged.to(getattr(torch, str(dtype))).save_pretrained(out, safe_serialization=True)
    source = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base_dir
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out
