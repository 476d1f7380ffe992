"""A learner rank other than 0 (``loomrl.run.learner_ranks``): joins the process group,
loads its shard of the models, then does what the driver orders until end-of-file."""

from __future__ import annotations

import os
import sys


def main() -> int:
    from loomrl import lifeline

    lifeline.watch_parent()  # a SIGKILLed driver sends no end-of-file to wait for
    import torch.distributed as dist

    from loomrl.run.learner_ranks import READY, join, receive
    from loomrl.run.train_models import load_models

    pipe = sys.stdin.buffer
    setup = receive(pipe)
    if setup is None:
        return 1
    config, checkpoint, rendezvous, rank, world = setup
    if config.placement(rank).device.type == "cuda":  # a missing GPU fails here, not later
        import torch

        torch.cuda.set_device(rank)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    os.dup2(2, 1)  # what it prints from here on goes to the driver's stderr
    join(rendezvous, rank, world, config)
    try:
        models = load_models(config, checkpoint)
        while (order := receive(pipe)) is not None:
            kind, args = order
            getattr(models, kind)(*args)
    finally:
        dist.destroy_process_group()  # always: gloo aborts at exit without it
    return 0


if __name__ == "__main__":
    sys.exit(main())
