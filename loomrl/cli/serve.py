"""``loomrl serve``: run vLLM's OpenAI-compatible server for a model spec, ready for
``engines.load("http://HOST:PORT", model=SPEC)`` (loomrl's weight loader, the RL routes,
the behaviour policy's logprobs); Ctrl-C or SIGTERM stops it and every process it
started."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from loomrl.cli.output import UsageError, console
from loomrl.models import DEFAULT_MODEL


def add_parser(sub: Any) -> None:
    sv = sub.add_parser("serve", help="serve a model over HTTP for a RemoteEngine (vLLM)")
    sv.add_argument(
        "--model", required=True, metavar="SPEC",
        help=f"model spec (e.g. {DEFAULT_MODEL}, tiny-random) or local HF directory",
    )  # fmt: skip
    sv.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    sv.add_argument(
        "--host", default="127.0.0.1",
        help="address to bind (default 127.0.0.1; any other address needs --api-key)",
    )  # fmt: skip
    sv.add_argument("--kv-cache-gib", type=int, metavar="N", help="KV cache size on CPU")
    sv.add_argument("--max-len", type=int, metavar="N", help="context length (default: model's)")
    sv.add_argument("--max-num-seqs", type=int, metavar="N", help="concurrent sequences")
    sv.add_argument(
        "--block-size", type=int, metavar="N",
        help="KV-cache block in tokens, the prefix cache's unit (vLLM's CPU default: 128)",
    )  # fmt: skip
    sv.add_argument(
        "--api-key", default=os.environ.get("LOOMRL_API_KEY"),
        help="require this bearer token on every route but /health, the RL routes included "
        "(default: $LOOMRL_API_KEY, else none)",
    )  # fmt: skip
    sv.add_argument("--seed", type=int, default=0, help="sampling seed of the server")
    sv.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16", "float16"],
        help="weights' dtype (default: the model's; float32 on a CPU without native bf16)",
    )  # fmt: skip
    sv.add_argument(
        "--tensor-parallel-size", type=int, metavar="N", help="GPUs one model is split over"
    )
    sv.add_argument(
        "--gpu-memory-utilization", type=float, metavar="F",
        help="share of each GPU's memory vLLM may take (vLLM's default 0.9)",
    )  # fmt: skip
    sv.add_argument(
        "--vllm-args", metavar="'ARGS'",
        help="other vLLM engine arguments, one quoted string (checked against vLLM's own "
        "list before the server starts), e.g. --vllm-args='--cpu-offload-gb 2'",
    )  # fmt: skip
    sv.add_argument(
        "--weight-transfer", choices=["loomrl_tcp", "nccl"], default="loomrl_tcp",
        help="how trainers' weight syncs come in: loomrl_tcp (weight_sync = 'transfer', any "
        "host, default) or vLLM's NCCL backend (weight_sync = 'nccl', GPUs on both sides)",
    )  # fmt: skip
    sv.set_defaults(func=cmd_serve)


def _check(args: argparse.Namespace) -> None:
    from loomrl.cli.checks import print_resolved
    from loomrl.engines.serve import server_command
    from loomrl.engines.serve_flags import GpuFlags
    from loomrl.engines.serve_flags import check as check_flags
    from loomrl.engines.serve_guard import is_loopback
    from loomrl.models import check_spec

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be in 1..65535")
    for name in ("kv_cache_gib", "max_len", "max_num_seqs", "block_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} {value}: must be >= 1")
    if not args.api_key and not is_loopback(args.host):
        raise UsageError(
            f"--host {args.host} without --api-key: the server's RL routes (weights, pause, "
            "collective_rpc) would answer anyone who reaches it; give --api-key (or "
            "$LOOMRL_API_KEY), or serve on 127.0.0.1"
        )
    check_spec(args.model)
    print_resolved(args.model)
    try:
        transfer = GpuFlags(weight_transfer=args.weight_transfer)  # refused on a CPU
        command = server_command(args.model, host=args.host, port=args.port, gpu=transfer)
        check_flags(gpu_flags(args), command)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((args.host, args.port))
        except OSError as exc:
            raise UsageError(f"cannot serve on {args.host}:{args.port}: {exc.strerror}") from None


def gpu_flags(args: argparse.Namespace) -> Any:
    from loomrl.engines.serve_flags import GpuFlags

    return GpuFlags.parse(
        args.tensor_parallel_size, args.gpu_memory_utilization, args.vllm_args,
        args.weight_transfer,
    )  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> int:
    from loomrl.engines.serve import ServerStartError, start_server

    _check(args)
    console.print(f"[bold]serve[/] {args.model} on {args.host}:{args.port}; starting vLLM "
                  "takes ~30-90 s")  # fmt: skip
    try:
        server = start_server(
            args.model, port=args.port, host=args.host, kv_cache_gib=args.kv_cache_gib,
            max_len=args.max_len, api_key=args.api_key, seed=args.seed,
            max_num_seqs=args.max_num_seqs, block_size=args.block_size, gpu=gpu_flags(args),
            dtype=args.dtype,
        )  # fmt: skip
    except ServerStartError as exc:
        raise UsageError(str(exc)) from None
    with server:
        console.print(f"serving {args.model} at {server.url} (log: {server.log}); Ctrl-C stops it",
                      markup=False, highlight=False)  # fmt: skip
        try:
            code = server.process.wait()
        except KeyboardInterrupt:
            console.print("stopping the server", markup=False, highlight=False)
            return 0
    raise UsageError(f"the vLLM server exited with status {code} (log: {server.log})")
