"""``padded_mask``: a padded micro-batch given to the model as the 4-D mask transformers
would build from its 2-D one gives the same hidden states (bitwise where there is padding:
the same sdpa call), reads nothing back from the device where the 2-D mask does, and is
left alone where it does not apply (packed, images, other attention implementations)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from loomrl.experience import micro_batches, pack, pad
from loomrl.experience.padded_mask import padded_mask
from loomrl.models import resolve
from loomrl.train.host_reads import HostReads
from loomrl.types import Trajectory

SHAPES = [(5, 4), (2, 7), (9, 3), (3, 5)]


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(resolve("tiny-random"), dtype=torch.float32)


def trajectories() -> list[Trajectory]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (p, c) in enumerate(SHAPES):
        ids = torch.randint(3, 49152, (p + c,), generator=g).tolist()
        out.append(Trajectory(i, i, 0, "t", ids[:p], ids[p:], [0.0] * c, [1] * c))
    return out


def hidden(model, mb, mask) -> torch.Tensor:
    with torch.no_grad():
        return model.model(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mask,
            use_cache=False,
        ).last_hidden_state  # fmt: skip


@pytest.mark.parametrize("budget", [10**6, 1], ids=["padding", "one sample each"])
def test_the_4d_mask_gives_the_2d_masks_hidden_states(model, budget):
    batch = pad(trajectories())
    for mb in micro_batches(batch, budget):
        mask = padded_mask(model, mb, mb.attention_mask)
        b, n = mb.input_ids.shape
        assert mask.shape == (b, 1, n, n) and mask.dtype == torch.bool
        got, want = hidden(model, mb, mask), hidden(model, mb, mb.attention_mask)
        real = mb.attention_mask.bool()
        if budget > 1:  # padding: transformers builds this very mask
            assert torch.equal(got[real], want[real])
        else:  # no padding: transformers lets sdpa mask causally instead
            assert torch.allclose(got[real], want[real], atol=1e-6, rtol=0)


def test_the_4d_mask_reads_nothing_back_where_the_2d_mask_does(model):
    (mb,) = micro_batches(pad(trajectories()), 10**6)
    counts = []
    for mask in (mb.attention_mask, padded_mask(model, mb, mb.attention_mask)):
        with HostReads().place(model, mb.input_ids, mb.position_ids, mask) as reads:
            hidden(model, mb, mask)
        counts.append(sum(reads.sites.values()))
    assert counts[0] > 0 and counts[1] == 0, counts


def test_it_leaves_what_it_does_not_apply_to(model):
    (padded,) = micro_batches(pad(trajectories()), 10**6)
    (packed,) = micro_batches(pack(trajectories()), 10**6)
    assert padded_mask(model, packed, None) is None
    with_images = dataclasses.replace(padded, pixels=object())  # type: ignore[arg-type]
    assert padded_mask(model, with_images, padded.attention_mask) is padded.attention_mask
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    assert padded_mask(eager, padded, padded.attention_mask) is padded.attention_mask
    sliding = copy.deepcopy(model)
    sliding.config.sliding_window = 4
    assert padded_mask(sliding, padded, padded.attention_mask) is padded.attention_mask
