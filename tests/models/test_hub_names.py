"""Models named as on the Hugging Face Hub (``org/name``, ``org/name@revision``): which
specs are Hub names, resolution from a cache laid out as ``huggingface_hub`` writes it,
``HF_HUB_OFFLINE=1`` honoured with no request at all, and each refusal as one line. The
Hub itself is the boundary faked here (``snapshot_download`` when online)."""

from __future__ import annotations

import json

import pytest
from hub_cache import (
    COMMIT,
    OTHER_COMMIT,
    REPO,
    lay_out,
    lay_out_default_model,
    offline_cache,
    refuse_network,
)

from loomrl.models import ModelError, check_spec, hub, hub_note, hub_snapshot, resolve

CONFIG = b'{"model_type": "llama"}'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of this test's own, offline."""
    return offline_cache(tmp_path, monkeypatch)


@pytest.fixture
def no_network(monkeypatch):
    refuse_network(monkeypatch)


def small_model(cache, repo_id="org/tiny", **kwargs):
    files = {
        "config.json": CONFIG, "model.safetensors": (2).to_bytes(8, "little") + b"{}",
        "tokenizer.json": b"{}", "tokenizer_config.json": b"{}",
    }  # fmt: skip
    return lay_out(cache, repo_id, files, **kwargs)


# -- which specs are Hub names -----------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "repo", "revision"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", None),
        ("HuggingFaceTB/SmolLM2-135M-Instruct@main", "HuggingFaceTB/SmolLM2-135M-Instruct", "main"),
        (f"org/name@{COMMIT}", "org/name", COMMIT),
        ("org/name@refs/pr/1", "org/name", "refs/pr/1"),
        ("my_org/model.v2", "my_org/model.v2", None),
    ],
)
def test_hub_names_are_read_with_their_revision(tmp_path, monkeypatch, spec, repo, revision):
    monkeypatch.chdir(tmp_path)
    assert hub.parse(spec) == hub.HubName(repo, revision)
    assert str(hub.parse(spec)) == spec


@pytest.mark.parametrize(
    "spec",
    [
        "smollm2-135m-instruct", "tiny-random:3", "http://127.0.0.1:8000", "https://h:1/v1",
        "/abs/org/name", "./org/name", "../org/name", "~/org/name", "a/b/c", "org/",
        "org--x/name", "org/na..me", "org/name@", "org/name@../x", "org/name.git",
    ],
)  # fmt: skip
def test_named_specs_urls_and_paths_are_not_hub_names(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    assert hub.parse(spec) is None


def test_a_local_directory_of_the_same_shape_stays_local(cache, tmp_path, monkeypatch):
    small_model(cache, "org/name")  # the Hub name is cached too: the local one still wins
    local = tmp_path / "work" / "org" / "name"
    local.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (local / name).write_text("{}")
    (local / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    monkeypatch.chdir(tmp_path / "work")
    assert hub.parse("org/name") is None and hub_snapshot("org/name") is None
    assert resolve("org/name") == local.resolve()


# -- the cache, offline ------------------------------------------------------------------


def test_the_cache_is_where_huggingface_hub_keeps_it(tmp_path, monkeypatch):
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub.cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.cache_dir() == tmp_path / "elsewhere"


def test_offline_a_cached_model_resolves_to_its_snapshot_without_a_request(cache, no_network):
    snapshot = lay_out_default_model(cache)
    assert resolve(REPO) == snapshot and snapshot.name == COMMIT
    check_spec(REPO)
    assert hub_note(REPO) == f"model {REPO}@{COMMIT}: {snapshot}"
    assert resolve(f"{REPO}@main") == snapshot  # a branch, through refs/main
    assert resolve(f"{REPO}@{COMMIT}") == snapshot  # a commit, its snapshot directly


def test_a_commit_resolves_to_its_own_snapshot_whatever_main_says(cache, no_network):
    old = small_model(cache, commit=COMMIT, ref=None)
    new = small_model(cache, commit=OTHER_COMMIT)  # refs/main -> the newer one
    assert resolve("org/tiny") == new
    assert resolve(f"org/tiny@{COMMIT}") == old


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_and_missing_is_one_line_naming_the_cache_and_the_way_out(
    cache, no_network, monkeypatch, variable
):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv(variable, "1")
    with pytest.raises(ModelError) as info:
        check_spec("org/missing@v2")
    message = str(info.value)
    assert message == (
        f"model org/missing@v2 is not in the Hugging Face cache ({cache}) and {variable}=1 "
        "forbids downloading it: run `hf download org/missing --revision v2` where the "
        f"network allows (with the same HF_HOME or HF_HUB_CACHE), or unset {variable}"
    )


def test_a_cached_snapshot_missing_model_files_is_named(cache, no_network):
    lay_out(cache, "org/partial", {"config.json": CONFIG, "tokenizer_config.json": b"{}"})
    with pytest.raises(ModelError) as info:
        resolve("org/partial")
    assert str(info.value) == (
        f"model org/partial in the Hugging Face cache ({cache / 'models--org--partial'}"
        f"/snapshots/{COMMIT}) is missing: weights (*.safetensors or *.bin), tokenizer "
        "(tokenizer.json or tokenizer.model); fetch it again with `hf download org/partial`"
    )


def test_a_cached_snapshot_missing_shards_of_its_weights_names_them(cache, no_network):
    """A download cut short leaves some shards of a sharded model; offline, the cache
    cannot tell, and the shard index says which are missing."""
    shards = [f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)]
    index = {"metadata": {}, "weight_map": {f"layer.{i}": name for i, name in enumerate(shards)}}
    files = {
        "config.json": CONFIG, "tokenizer.json": b"{}", "tokenizer_config.json": b"{}",
        "model.safetensors.index.json": json.dumps(index).encode(),
    }  # fmt: skip
    weights = (2).to_bytes(8, "little") + b"{}"
    lay_out(cache, "org/whole", {**files, **{name: weights for name in shards}})
    assert resolve("org/whole").name == COMMIT
    lay_out(cache, "org/cut", {**files, shards[0]: weights})
    with pytest.raises(ModelError) as info:
        check_spec("org/cut")
    assert str(info.value) == (
        f"model org/cut in the Hugging Face cache ({cache / 'models--org--cut'}/snapshots/"
        f"{COMMIT}) is missing: weights shards ({', '.join(shards[1:4])} and 1 more); fetch "
        "it again with `hf download org/cut`"
    )


def test_unknown_specs_name_hub_names_among_the_choices(cache):
    with pytest.raises(ModelError, match=r"or a Hub name 'org/name\[@revision\]'"):
        resolve("gpt-5")


# -- online: the Hub is faked at snapshot_download ----------------------------------------


@pytest.fixture
def online(cache, monkeypatch):
    """``snapshot_download`` answering from a fake Hub; ``calls`` lists what was asked."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    import huggingface_hub

    calls: list[dict] = []
    repos: dict[str, dict] = {}
    real = huggingface_hub.snapshot_download

    def fake(repo_id, **kwargs):
        calls.append({"repo_id": repo_id, **kwargs})
        if kwargs["local_files_only"]:  # the cache alone: no request, the real thing
            return real(repo_id, **kwargs)
        if repo_id not in repos:
            error = huggingface_hub.errors.RepositoryNotFoundError.__new__(
                huggingface_hub.errors.RepositoryNotFoundError
            )
            Exception.__init__(error, "404 Client Error")
            raise error
        files = {
            name: data for name, data in repos[repo_id].items()
            if any(_match(name, p) for p in kwargs["allow_patterns"])
            and not any(_match(name, p) for p in kwargs.get("ignore_patterns") or [])
        }  # fmt: skip
        return str(lay_out(cache, repo_id, files, repo_type=kwargs["repo_type"]))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return calls, repos


def _match(name: str, pattern: str) -> bool:
    from fnmatch import fnmatchcase

    return fnmatchcase(name, pattern)


def test_online_a_model_is_downloaded_once_with_only_its_loadable_files(online, cache):
    calls, repos = online
    repos["org/big"] = {
        "config.json": CONFIG, "tokenizer.json": b"{}", "tokenizer_config.json": b"{}",
        "model.safetensors": (2).to_bytes(8, "little") + b"{}",
        "consolidated.safetensors": b"mistral's own copy", "onnx/model.onnx": b"other format",
        "original/consolidated.00.pth": b"other format", "README.md": b"card",
    }  # fmt: skip
    path = resolve("org/big")
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]  # fmt: skip
    assert resolve("org/big") == path and check_spec("org/big") is None
    assert len(calls) == 1  # resolved once per process: one commit for the whole run
    assert calls[0]["cache_dir"] == str(cache) and calls[0]["local_files_only"] is False


def test_online_a_model_without_safetensors_gets_its_bin_weights(online):
    calls, repos = online
    repos["org/old"] = {
        "config.json": CONFIG, "tokenizer.json": b"{}", "tokenizer_config.json": b"{}",
        "pytorch_model.bin": b"pickled weights",
    }  # fmt: skip
    path = resolve("org/old")
    assert (path / "pytorch_model.bin").is_file()
    assert [c["allow_patterns"] for c in calls] == [hub.MODEL_FILES, hub.MODEL_BIN_FILES]


def test_online_a_cached_commit_is_used_without_asking_the_hub(online, cache):
    calls, _ = online
    snapshot = small_model(cache)
    assert resolve(f"org/tiny@{COMMIT}") == snapshot
    assert [c["local_files_only"] for c in calls] == [True]


def test_online_a_name_the_hub_does_not_know_is_one_line(online):
    with pytest.raises(ModelError) as info:
        check_spec("models/my-model")  # a mistyped local path looks like a Hub name
    assert str(info.value) == (
        "model models/my-model is neither a local path nor a model on the Hugging Face Hub "
        "(private ones need `hf auth login` or HF_TOKEN)"
    )
