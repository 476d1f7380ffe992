"""The last hidden states of a sharded (FSDP2) causal LM, through its whole forward pass.

A sharded model's root unit (``loomrl.train.sharding``) gathers its own parameters, the
embeddings, the final norm and the LM head, in its forward pre-hook, and keeps them
gathered until its backward pass is over. Calling the decoder directly would skip that
hook and compute with shards. So ``RootDecoder`` runs the whole model, asks it for no
logits at all (``logits_to_keep``: an empty index, a ``[b, 0, V]`` result), and reads
the decoder's output off a forward hook. After the call the head's weight is the gathered
parameter: the chunked head (``loomrl.experience.token_scores``) multiplies by it a chunk
of rows at a time, and its gradient accumulates into that parameter's, which FSDP
reduce-scatters with the rest of the root's at the end of the backward pass. No
``[k, V]`` logits exist on any rank, forward or backward.
"""

from __future__ import annotations

from typing import Any

import torch


class RootDecoder:
    """Called like the decoder (``decoder(**inputs).last_hidden_state``), run through the
    whole ``model``."""

    def __init__(self, model: torch.nn.Module, decoder: torch.nn.Module) -> None:
        self.model, self.decoder = model, decoder

    def __call__(self, **inputs: Any) -> Any:
        seen: list[Any] = []

        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            seen.append(output)

        device = inputs["input_ids"].device
        nothing = torch.zeros(0, dtype=torch.long, device=device)
        handle = self.decoder.register_forward_hook(keep)
        try:
            self.model(**inputs, logits_to_keep=nothing)
        finally:
            handle.remove()
        if len(seen) != 1:
            raise RuntimeError(
                f"{type(self.model).__name__}'s forward ran its decoder {len(seen)} times"
            )
        return seen[0]
