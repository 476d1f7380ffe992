"""``loomrl serve``'s GPU flags: tensor parallelism, the GPU memory share, and any other
vLLM engine argument passed through, checked against vLLM's own argument parser before
a server starts (a typo is one line, not a server that dies after a minute of loading).
Arguments that loomrl sets itself (the model, the port, the logprobs mode the token
contract depends on, ...) cannot be passed through."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

WEIGHT_TRANSFERS = ("loomrl_tcp", "nccl")  # what a server's workers take syncs through


@dataclass(frozen=True)
class GpuFlags:
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)  # other vLLM arguments, as given
    weight_transfer: str = "loomrl_tcp"  # vLLM's NCCL backend: trainers with weight_sync "nccl"

    @classmethod
    def parse(
        cls, tensor: int | None, memory: float | None, extra: str | None,
        transfer: str = "loomrl_tcp",
    ) -> GpuFlags:  # fmt: skip
        return cls(tensor, memory, tuple(shlex.split(extra or "")), transfer)

    def args(self) -> list[str]:
        out = []
        if self.tensor_parallel_size is not None:
            out += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.gpu_memory_utilization is not None:
            out += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        return out + list(self.extra)


def check(flags: GpuFlags, command: list[str]) -> None:
    """``ValueError`` naming the problem when ``flags`` would not start vLLM: a value out
    of range, an argument vLLM does not know, or one loomrl's ``command`` already sets."""
    if flags.tensor_parallel_size is not None and flags.tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size {flags.tensor_parallel_size}: must be >= 1")
    memory = flags.gpu_memory_utilization
    if memory is not None and not 0 < memory <= 1:
        raise ValueError(f"--gpu-memory-utilization {memory}: must be in (0, 1]")
    if not flags.extra:
        return
    ours = {arg.split("=", 1)[0] for arg in command if arg.startswith("--")}
    theirs = [arg.split("=", 1)[0] for arg in flags.extra if arg.startswith("--")]
    taken = [arg for arg in theirs if arg in ours]
    if taken:
        raise ValueError(
            f"--vllm-args {' '.join(taken)}: loomrl sets it for the server (use loomrl's own "
            "flag where there is one)"
        )
    parser = _vllm_parser()
    try:
        parser.parse_args(["--model", "m", *flags.extra])
    except _Refused as exc:
        raise ValueError(f"--vllm-args {shlex.join(flags.extra)}: vLLM says: {exc}") from None


class _Refused(Exception):
    pass


def _vllm_parser():  # type: ignore[no-untyped-def]
    """vLLM's own ``vllm serve`` parser, raising instead of exiting."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())

    def refuse(message: str) -> None:
        raise _Refused(message)

    parser.error = refuse  # type: ignore[method-assign]
    return parser
