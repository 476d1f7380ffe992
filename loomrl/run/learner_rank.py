"""A learner rank other than 0 that the driver started on its host
(``loomrl.run.learner_ranks.LocalRanks``): joins the process group, builds its shard of
the models, then does what the driver orders on its stdin until end-of-file."""

from __future__ import annotations

import os
import sys


def main() -> int:
    from loomrl import lifeline

    lifeline.watch_parent()  # a SIGKILLed driver sends no end-of-file to wait for
    import torch.distributed as dist

    from loomrl.distributed.launch_env import local_rank
    from loomrl.run.learner_ranks import READY, receive
    from loomrl.run.rank_group import join, reach_store

    pipe = sys.stdin.buffer
    setup = receive(pipe)
    if setup is None:
        return 1
    make, rendezvous, rank, world, cuda = setup
    if cuda:  # a missing GPU fails here, not later
        import torch

        torch.cuda.set_device(local_rank())
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    os.dup2(2, 1)  # what it prints from here on goes to the driver's stderr
    join(reach_store(rendezvous, world), rank, world, cuda)
    try:
        models = make()
        while (order := receive(pipe)) is not None:
            kind, args = order
            getattr(models, kind)(*args)
    finally:
        dist.destroy_process_group()  # always: gloo aborts at exit without it
    return 0


if __name__ == "__main__":
    sys.exit(main())
