"""Models named as on the Hugging Face Hub, and the tool-call parser that follows the chat
template, on real vLLM.

``loomrl rollout --model HuggingFaceTB/SmolLM2-135M-Instruct`` runs as a user runs it, with
``HF_HUB_OFFLINE=1`` and a cache laid out as ``huggingface_hub`` writes it: vLLM serves
the snapshot, the commit is printed and recorded. Then the default model's weights play
the ``calculator`` under Mistral v0.3's, gpt-oss's, Qwen3's and Llama 3.1's chat
templates with no parser named: no episode ends in a template error (before ``auto``,
the Hermes parser gave Mistral's template call ids it refuses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections import Counter

import pytest
from families import FAMILIES
from hub_cache import COMMIT, REPO, lay_out_default_model

import loomrl
from loomrl.envs.calculator import CalculatorEnv
from loomrl.runs import read_trajectories
from loomrl.tokens import ChatTokenizer
from loomrl.types import Status

pytestmark = pytest.mark.e2e

# Family (tests/families.py; `hermes` is Qwen3's template) -> the parser it calls for.
TEMPLATES = {
    "mistral": "mistral",
    "gpt_oss": "harmony",
    "hermes": "hermes",
    "llama3_1": "llama3_json",
}


def test_cli_rollout_of_a_hub_model_offline_on_vllm(tmp_path):
    cache = tmp_path / "hf" / "hub"
    snapshot = lay_out_default_model(cache)
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "loomrl.cli", "rollout", "--model", REPO, "--env", "calculator",
         "--examples", "2", "--n", "2", "--max-tokens", "16", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"note: model {REPO}@{COMMIT}: {snapshot}" in done.stderr.splitlines()
    text = (out / "config.toml").read_text()
    assert text.startswith(f"# model {REPO} is {REPO}@{COMMIT} (from the Hugging Face cache)")
    assert tomllib.loads(text)["model"] == REPO
    trajs = read_trajectories(out / "trajectories.parquet")
    assert len(trajs) == 4 and all(t["status"] != "error" for t in trajs)
    assert json.loads((out / "metrics.json").read_text())["parser"] == "hermes"


@pytest.mark.parametrize("name", sorted(TEMPLATES))
async def test_no_template_error_under_four_families_templates_with_no_parser_named(
    default_engine, name
):
    chat = ChatTokenizer(
        default_engine.tokenizer, chat_template=FAMILIES[name].template.read_text()
    )
    env = CalculatorEnv()  # no parser named
    sampling = loomrl.SamplingParams(max_tokens=32, temperature=1.0, seed=0)
    trajs = await loomrl.rollout(
        default_engine, env, env.dataset(6, seed=1), chat=chat, sampling=sampling,
        max_turns=3, on_error="isolate",
    )  # fmt: skip
    assert env.parser_name == TEMPLATES[name]
    errors = Counter(t.error for t in trajs if t.status == Status.ERROR)
    assert not errors, errors
