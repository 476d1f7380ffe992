"""Learner ranks load the commit the driver resolved: a sharded run's config goes to the
ranks with its Hub names pinned to ``org/name@<commit>``, so a branch that moves while
they start (or a rank on a host with another cache) cannot give one rank other weights."""

from __future__ import annotations

from hub_cache import COMMIT, REPO, lay_out_default_model

from loomrl.models import hub
from loomrl.run.learner_ranks import pin_hub_names
from loomrl.train.config import TrainConfig


def test_hub_names_are_pinned_to_their_commit_and_other_specs_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub._snapshot.cache_clear()
    lay_out_default_model(tmp_path / "hub")
    config = TrainConfig(model=REPO, critic_model="tiny-random", algorithm="ppo")
    pinned = pin_hub_names(config)
    assert (pinned.model, pinned.critic_model) == (f"{REPO}@{COMMIT}", "tiny-random")
    assert pin_hub_names(pinned) is pinned  # pinned already: nothing to change
    plain = TrainConfig(model="tiny-random")
    assert pin_hub_names(plain) is plain
    hub._snapshot.cache_clear()
