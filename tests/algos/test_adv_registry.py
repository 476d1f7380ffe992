"""The advantage-estimator registry: ``compute(name, **inputs)`` is the single dispatch
path, and every registered estimator honours one contract (shapes, zeros under mask 0,
finite outputs on groups of one and all-equal rewards, no autograd).

Compared with verl's ``verl/trainer/ppo/core_algos.py::register_adv_est`` /
``get_adv_estimator_fn`` registry, whose callers still branch on the name
(``compute_advantage``: ``if adv_estimator == GAE: ...``); loomrl has no such branch.
"""

from __future__ import annotations

import pytest
import torch
from algos_helpers import PROPERTY, Batch, assert_finite, batches
from hypothesis import given

from loomrl.algos import advantages as A

BUILT_INS = {"grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"}


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so test registrations do not leak."""
    monkeypatch.setattr(A, "_ESTIMATORS", dict(A._ESTIMATORS))
    return A


def _universal_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    """Everything a learner might hold for a batch; each estimator takes what it accepts."""
    r, ids, mask = batch.tensors()
    gen = torch.Generator().manual_seed(len(batch.rewards))
    shape = mask.shape
    return {
        "rewards": r,
        "group_ids": ids,
        "mask": mask,
        "kl": torch.rand(shape, generator=gen, dtype=torch.float64) * 0.1,
        "values": torch.rand(shape, generator=gen, dtype=torch.float64),
        "token_rewards": torch.zeros(shape, dtype=torch.float64),
    }


def test_built_ins_are_registered_with_descriptions() -> None:
    names = A.available()
    assert set(names) >= BUILT_INS
    assert list(names) == sorted(names)
    assert all(desc for desc in names.values())


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError) as err:
        A.compute("ppo", rewards=torch.zeros(1))
    for name in BUILT_INS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        A.accepted_inputs("ppo")


def test_unexpected_input_names_what_is_accepted() -> None:
    with pytest.raises(TypeError, match=r"unexpected inputs \['values'\].*group_ids"):
        A.compute(
            "rloo",
            rewards=torch.zeros(2),
            group_ids=torch.zeros(2, dtype=torch.long),
            mask=torch.ones(2, 1),
            values=torch.zeros(2, 1),
        )


def test_registered_estimator_is_reached_through_compute(registry) -> None:
    seen = {}

    @registry.register("constant")
    def constant(mask: torch.Tensor, value: float = 1.0) -> A.AdvantageOutput:
        """Every model token gets ``value``."""
        seen["grad"] = torch.is_grad_enabled()
        adv = mask.to(torch.float32) * value
        return A.AdvantageOutput(adv, adv)

    out = registry.compute("constant", mask=torch.tensor([[1, 0]]), value=2.0)
    assert out.advantages.tolist() == [[2.0, 0.0]]
    assert seen["grad"] is False  # compute runs estimators without autograd
    assert registry.available()["constant"] == "Every model token gets ``value``."
    assert registry.accepted_inputs("constant") == ("mask", "value")


def test_duplicate_names_need_replace_and_bad_names_are_refused(registry) -> None:
    def fake(mask):
        return A.AdvantageOutput(mask, mask)

    with pytest.raises(ValueError, match="already registered"):
        registry.register("grpo")(fake)
    registry.register("grpo", replace=True)(fake)
    assert registry.compute("grpo", mask=torch.ones(1, 1)).advantages.tolist() == [[1.0]]
    for bad in ("", " grpo"):
        with pytest.raises(ValueError, match="invalid"):
            registry.register(bad)


def test_estimator_output_contract_is_enforced(registry) -> None:
    registry.register("wrong_type")(lambda mask: (mask, mask))
    registry.register("wrong_shape")(lambda mask: A.AdvantageOutput(mask, mask[:, :1]))
    with pytest.raises(TypeError, match="not AdvantageOutput"):
        registry.compute("wrong_type", mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match="returned advantages"):
        registry.compute("wrong_shape", mask=torch.ones(2, 2))


@PROPERTY
@given(batch=batches(max_len=5))
def test_every_built_in_honours_the_contract(batch: Batch) -> None:
    """Shapes [B, T], zeros under mask 0, finite — on singletons and all-equal rewards too.

    One generic loop over the registry: inputs are picked by ``accepted_inputs``, never
    by branching on the estimator's name.
    """
    available = _universal_inputs(batch)
    mask = available["mask"]
    for name in sorted(BUILT_INS):
        inputs = {k: v for k, v in available.items() if k in A.accepted_inputs(name)}
        out = A.compute(name, **inputs)
        assert out.advantages.shape == mask.shape == out.returns.shape, name
        assert_finite(out.advantages, out.returns)
        assert (out.advantages[mask == 0] == 0).all(), name
        assert (out.returns[mask == 0] == 0).all(), name
        assert not out.advantages.requires_grad


def test_inputs_that_require_grad_give_constant_advantages() -> None:
    values = torch.rand(2, 3, requires_grad=True)
    out = A.compute("gae", values=values, mask=torch.ones(2, 3), rewards=torch.ones(2))
    assert not out.advantages.requires_grad and not out.returns.requires_grad
