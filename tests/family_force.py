"""A vLLM logits processor for tests: a request whose ``extra_args`` name a ``script``
samples exactly those token ids, then ends (the script's last id is a stop).

Random weights never write a tool call; a family's matrix test needs each family's call
text sampled by vLLM, so the test writes it and vLLM does the rest (prompt, forward
passes, stop handling, logprobs). With ``logprobs_mode="raw_logprobs"`` the logprobs
vLLM returns are the model's own, before this mask."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

SCRIPT = "script"


class ForceScript(AdapterLogitsProcessor):
    """Per request: every logit but the script's next id is ``-inf``."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what is sampled, greedy included

    def new_req_logits_processor(self, params: Any) -> Callable[..., torch.Tensor] | None:
        script = (params.extra_args or {}).get(SCRIPT)
        if not script:
            return None
        ids = [int(i) for i in script]

        def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            if len(output_ids) >= len(ids):
                return logits
            keep = ids[len(output_ids)]
            chosen = logits[..., keep].clone()
            logits.fill_(float("-inf"))
            logits[..., keep] = chosen
            return logits

        return force
