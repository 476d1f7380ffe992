"""``SamplingParams`` as the fields of a vLLM server request (completions and generate
bodies alike): every knob it has, and every knob it has not at vLLM's neutral value, so
a server samples exactly as ``VLLMEngine`` does in process."""

from __future__ import annotations

from typing import Any

from loomrl.types import SamplingParams

# Every sampling knob SamplingParams has no field for, at the value VLLMEngine uses.
NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "n": 1}  # fmt: skip


def sampling_fields(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """The request's sampling fields; the sampled token's logprob is asked for."""
    return {
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0,
        "min_p": params.min_p,
        "min_tokens": params.min_tokens,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "seed": params.seed,
        "ignore_eos": params.ignore_eos,
        "include_stop_str_in_output": True,
        "skip_special_tokens": True,
        "logprobs": 0,  # the sampled token's logprob only
        **NEUTRAL,
    }
