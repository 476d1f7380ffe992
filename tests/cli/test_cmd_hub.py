"""Models and data named as on the Hugging Face Hub, through the commands, offline: a cache
laid out as ``huggingface_hub`` writes it (``tests/hub_cache.py``) serves ``loomrl
rollout --model HuggingFaceTB/SmolLM2-135M-Instruct`` and a 2-step ``loomrl train`` (of
``tiny-random``'s files under a Hub name: the learner trains a 2-layer model in seconds);
the resolved commit is printed once and recorded in ``config.toml`` (the ``model`` field
as written), and ``--resume`` keeps to that commit after the branch has moved on. A name
missing from the cache is one line, exit 2, before any engine starts."""

from __future__ import annotations

import json
import tomllib

import pytest
from hub_cache import COMMIT, OTHER_COMMIT, REPO, lay_out, lay_out_default_model
from transformers import AutoTokenizer

from loomrl.engines import ScriptedEngine
from loomrl.models import hub, resolve
from loomrl.run import engines
from loomrl.runs import read_trajectories

FIRST = f"# model {REPO} is {REPO}@{COMMIT} (from the Hugging Face cache)"
TINY = "loomrl-test/tiny-random"
SMALL = ["--env", "calculator", "--examples", "2", "--n", "2", "--max-tokens", "8"]


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory):
    """The default model's files as ``REPO`` and tiny-random's as ``TINY``, both at
    ``COMMIT`` (laid out once per module)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    tiny = resolve("tiny-random")
    lay_out(cache, TINY, {p.name: p for p in tiny.iterdir() if p.name != "loomrl-model.json"})
    return cache, lay_out_default_model(cache)


@pytest.fixture
def cache(laid_out, monkeypatch):
    """The laid-out cache, offline; ``refs/main`` back at ``COMMIT`` after each test."""
    cache, snapshot = laid_out
    for variable in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub._snapshot.cache_clear()
    yield cache, snapshot
    for repo in (REPO, TINY):
        (cache / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text(COMMIT)
    hub._snapshot.cache_clear()


@pytest.fixture
def hub_engines(monkeypatch):
    """Scripted engines over the tokenizer of the directory each order resolves to;
    ``orders`` lists the orders."""
    orders = []

    def build(order):
        orders.append(order)
        tokenizer = AutoTokenizer.from_pretrained(resolve(str(order.model)))
        engine = ScriptedEngine(lambda ids, params: "Answer: 3", tokenizer=tokenizer)
        engine.set_policy_version(order.policy_version)
        return engine

    monkeypatch.setattr(engines, "build_engine", build)
    return orders


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: model ")]


def move_main(cache, commit: str, repo: str = REPO) -> None:
    """The branch moves on upstream: ``refs/main`` names a commit not in the cache."""
    (cache / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text(commit)
    hub._snapshot.cache_clear()


def test_rollout_resolves_a_hub_model_offline_and_records_its_commit(
    cli, cache, hub_engines, tmp_path
):
    _, snapshot = cache
    out = tmp_path / "run"
    result = cli("rollout", "--model", REPO, *SMALL, "--out", out)
    assert result.code == 0, result.err
    assert notes(result.err) == [f"note: model {REPO}@{COMMIT}: {snapshot}"]  # once
    assert [str(order.model) for order in hub_engines] == [REPO]
    text = (out / "config.toml").read_text()
    assert text.splitlines()[0] == FIRST
    assert tomllib.loads(text)["model"] == REPO  # the spec as written
    assert json.loads((out / "metrics.json").read_text())["parser"] == "hermes"  # ChatML

    # Resumed after main moved to a commit this cache lacks: the recorded commit serves.
    (out / "trajectories.parquet").unlink()  # killed while writing its files, say
    move_main(cache[0], OTHER_COMMIT)
    result = cli("rollout", "--resume", out)
    assert result.code == 0, result.err
    assert notes(result.err) == [f"note: model {REPO}@{COMMIT}: {snapshot}"]
    assert (out / "config.toml").read_text() == text
    assert cli("rollout", "--model", REPO, *SMALL, "--out", tmp_path / "new").code == 2


def test_a_hub_models_chat_template_chooses_the_tool_parser(cli, cache, hub_engines, tmp_path):
    """A Hub model whose template is Mistral v0.3's (the default model's files, another
    template): the calculator reads Mistral calls and the run records the choice."""
    from families import FAMILIES

    hub_cache, snapshot = cache
    files = {p.name: p for p in snapshot.iterdir() if p.name != "chat_template.jinja"}
    files["chat_template.jinja"] = FAMILIES["mistral"].template.read_bytes()
    lay_out(hub_cache, "org/smol-mistral-template", files)
    out = tmp_path / "run"
    result = cli("rollout", "--model", "org/smol-mistral-template", *SMALL, "--out", out)
    assert result.code == 0, result.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["parser"] == "mistral"


TRAIN = f"""[train]
model = "{TINY}"
env = "arith"
steps = 2
prompts_per_step = 1
n = 2
max_tokens = 4
max_len = 128
checkpoint_every = 2
lr = 0.001

[train.env_args]
max_operand = 5
"""


def test_a_two_step_train_from_a_hub_model_records_its_commit_and_resumes(
    cli, cache, hub_engines, tmp_path
):
    hub_cache, _ = cache
    snapshot = hub_cache / f"models--{TINY.replace('/', '--')}" / "snapshots" / COMMIT
    first = f"# model {TINY} is {TINY}@{COMMIT} (from the Hugging Face cache)"
    config, out = tmp_path / "train.toml", tmp_path / "run"
    config.write_text(TRAIN)
    result = cli("train", config, "--out", out)
    assert result.code == 0, result.err
    assert notes(result.err) == [f"note: model {TINY}@{COMMIT}: {snapshot}"]
    text = (out / "config.toml").read_text()
    assert text.splitlines()[0] == first and tomllib.loads(text)["model"] == TINY
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]

    move_main(hub_cache, OTHER_COMMIT, TINY)  # unpinned, the name would not resolve now
    result = cli("train", "--resume", out, "--steps", "3")
    assert result.code == 0, result.err
    assert notes(result.err) == [f"note: model {TINY}@{COMMIT}: {snapshot}"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert first in (out / "config.toml").read_text().splitlines()  # kept by the steps note


def test_rollout_draws_a_hub_data_set_offline_and_records_its_commit(
    cli, cache, hub_engines, tmp_path
):
    hub_cache, _ = cache
    rows = [{"question": f"What is {i} + 1?", "answer": i + 1} for i in range(3)]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    snapshot = lay_out(hub_cache, "org/sums", {"data/train.jsonl": data}, repo_type="dataset")
    out = tmp_path / "run"
    argv = ["--env", "arith", "--n", "1", "--max-tokens", "8", "--out", out]
    result = cli("rollout", "--data", "org/sums", *argv)
    assert result.code == 0, result.err
    assert f"note: data org/sums@{COMMIT}: {snapshot}" in result.err.splitlines()
    assert len(read_trajectories(out / "trajectories.parquet")) == 3
    text = (out / "config.toml").read_text()
    assert f"# data org/sums is org/sums@{COMMIT} (from the Hugging Face cache)" in text
    assert tomllib.loads(text)["data"]["path"] == "org/sums"

    (out / "trajectories.parquet").unlink()
    main = hub_cache / "datasets--org--sums" / "refs" / "main"
    main.write_text(OTHER_COMMIT)  # moved on upstream; the resumed run keeps its commit
    hub._snapshot.cache_clear()
    result = cli("rollout", "--resume", out)
    assert result.code == 0, result.err
    assert f"note: data org/sums@{COMMIT}: {snapshot}" in result.err.splitlines()


def test_offline_a_missing_hub_data_set_is_one_line_before_any_engine(cli, cache, tmp_path):
    hub_cache, _ = cache
    result = cli("rollout", "--data", "org/none", "--env", "arith", "--out", tmp_path / "o")
    assert result.code == 2
    assert result.error == (
        f"org/none: no such local path, and data set org/none is not in the Hugging Face "
        f"cache ({hub_cache}) and HF_HUB_OFFLINE=1 forbids downloading it: run `hf download "
        "org/none --repo-type dataset` where the network allows (with the same HF_HOME or "
        "HF_HUB_CACHE), or unset HF_HUB_OFFLINE"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["rollout", "--model", "org/missing"],
        ["train", "--model", "org/missing"],
        ["eval", "--model", "org/missing", "--env", "arith"],
        ["generate", "hi", "--model", "org/missing"],
        ["serve", "--model", "org/missing", "--port", "18561"],
        ["models", "prepare", "org/missing"],
    ],
)
def test_offline_a_missing_hub_model_is_one_line_before_any_engine(cli, cache, tmp_path, argv):
    hub_cache, _ = cache
    result = cli(*argv, *(["--out", tmp_path / "out"] if argv[0] in ("rollout", "train") else []))
    assert result.code == 2
    assert result.error == (
        f"model org/missing is not in the Hugging Face cache ({hub_cache}) and "
        "HF_HUB_OFFLINE=1 forbids downloading it: run `hf download org/missing` where the "
        "network allows (with the same HF_HOME or HF_HUB_CACHE), or unset HF_HUB_OFFLINE"
    )
    assert not (tmp_path / "out").exists()
