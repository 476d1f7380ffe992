"""``tiny-reward``: a one-label sequence classifier built offline from the default model's
tokenizer, cached, byte-identical across builds; ``loomrl models prepare tiny-reward``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from loomrl import models
from loomrl.cli import main
from loomrl.models import DEFAULT_MODEL, check_spec, is_prepared, resolve
from loomrl.models.tiny_reward import build


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh LOOMRL_HOME that sees the prepared default model."""
    default = resolve(DEFAULT_MODEL)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / DEFAULT_MODEL).symlink_to(default)
    monkeypatch.setenv("LOOMRL_HOME", str(tmp_path))
    return tmp_path


def sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def test_models_prepare_builds_a_deterministic_one_label_classifier(home, tmp_path, capsys):
    import torch

    assert "tiny-reward" in models.NAMED and not is_prepared("tiny-reward")
    check_spec("tiny-reward")
    assert main(["models", "prepare", "tiny-reward"]) == 0
    built = home / "models" / "tiny-reward"
    assert str(built) in capsys.readouterr().out.replace("\n", "")  # rich wraps the line
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert len(config["id2label"]) == 1 and not models.missing_parts(built)
    assert resolve("tiny-reward") == built
    rng = torch.random.get_rng_state()
    build(tmp_path / "again", resolve(DEFAULT_MODEL))
    assert torch.equal(torch.random.get_rng_state(), rng)  # the seed stays in the build
    assert sha256(tmp_path / "again" / "model.safetensors") == sha256(built / "model.safetensors")
