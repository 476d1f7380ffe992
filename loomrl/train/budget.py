"""``micro_batch_tokens``: how many tokens one forward/backward pass of the learner takes.

A set number is used as it is. ``"auto"`` is what the run's memory plan
(``loomrl.train.memory_plan.micro_batch_tokens``) leaves for the activations once every
other part of the learning phase is placed (the learner's weights, gradients, AdamW
moments, reference, critic, bf16 copies, the head's chunk reserve, a colocated engine
asleep or an engine awake beside it), at ``(10 h + 4 i)`` activation values per token and
decoder layer in the compute dtype and ``6 h`` in the weights' (``loomrl.train.
memory_parts``), made a token count here. It is an estimate: the run records the budget it
chose (``learner/micro_batch_tokens``) and a set number overrides it. The budget changes
how a step is cut, never its gradient.
"""

from __future__ import annotations

#: Bounds and granularity of an automatic budget, in tokens.
SMALLEST, LARGEST, STEP = 256, 65536, 256


def tokens_for(free_bytes: int, bytes_per_token: int) -> int:
    """The budget whose activations fit ``free_bytes``: a multiple of ``STEP`` between
    ``SMALLEST`` (never 0: where even that does not fit, the plan says so) and
    ``LARGEST``."""
    tokens = max(0, free_bytes) // bytes_per_token // STEP * STEP
    return max(SMALLEST, min(LARGEST, tokens))
