"""``--model`` repeated: a pool of engine replicas for ``loomrl rollout`` and ``loomrl
train`` (scripted replicas here; real servers in tests/e2e); replica lists that cannot
serve the run are one line, exit 2, before any engine starts."""

from __future__ import annotations

import json
import tomllib

from train_runs import TINY_TRAIN

SMALL = ["--env", "guess_number", "--examples", "3", "--n", "2", "--max-tokens", "8"]
MODEL = "smollm2-135m-instruct"


def test_rollout_with_the_spec_twice_runs_on_a_pool_of_two(cli, scripted, tmp_path):
    out = tmp_path / "run"
    result = cli("rollout", *SMALL, "--model", MODEL, "--model", MODEL, "--out", out)
    assert result.code == 0, result.err
    assert len(scripted) == 2
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["engine/replicas"] == 2 and metrics["engine/failovers"] == 0
    turns = metrics["engine/0/requests"] + metrics["engine/1/requests"]
    assert turns == round(metrics["turns_mean"] * metrics["trajectories"])
    assert tomllib.loads((out / "config.toml").read_text())["engines"] == [MODEL, MODEL]


def test_two_models_on_the_command_line_are_refused(cli, tmp_path):
    result = cli("rollout", *SMALL, "--model", MODEL, "--model", "tiny-random",
                 "--out", tmp_path / "run")  # fmt: skip
    assert result.code == 2
    assert result.error.startswith("--model names 2 different models")


def test_a_config_replica_of_another_model_is_refused(cli, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(f"model = '{MODEL}'\nengines = ['tiny-random']\n")
    result = cli("rollout", "--config", path, "--out", tmp_path / "run")
    assert result.code == 2
    assert "engines entry 'tiny-random' is neither a server URL" in result.error


def test_train_on_a_pool_syncs_weights_to_every_replica(cli, scripted, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_TRAIN)
    out = tmp_path / "run"
    result = cli("train", path, "--model", "tiny-random", "--model", "tiny-random", "--out", out)
    assert result.code == 0, result.err
    assert len(scripted) == 2
    assert [e.policy_version for e in scripted] == [2, 2]  # both replicas got every sync
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["engine/replicas"] for r in rows] == [2, 2]
    assert all(r["engine/healthy"] == 2 for r in rows)


def test_a_resumed_rollout_takes_the_replicas_it_is_given(cli, scripted, tmp_path):
    from loomrl.cli import build_parser
    from loomrl.cli.rollout import requested

    out = tmp_path / "run"
    assert cli("rollout", *SMALL, "--out", out).code == 0
    urls = ["--model", "http://127.0.0.1:8001", "--model", "http://127.0.0.1:8002"]
    args = build_parser().parse_args(["rollout", "--resume", str(out), *urls])
    assert requested(args).engines == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    args = build_parser().parse_args(["rollout", "--resume", str(out)])
    assert requested(args).engines == []  # as recorded


def test_a_resumed_training_run_takes_the_replicas_it_is_given(run):
    from loomrl.cli import build_parser
    from loomrl.cli.train import requested

    urls = ["--model", "http://127.0.0.1:8001", "--model", "http://127.0.0.1:8002"]
    args = build_parser().parse_args(["train", "--resume", str(run), *urls])
    config, _ = requested(args)
    assert config.engines == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    config, _ = requested(build_parser().parse_args(["train", "--resume", str(run)]))
    assert config.engines == []


def test_pool_settings_from_flags_and_toml_reach_the_pool(cli, scripted, tmp_path, monkeypatch):
    from loomrl.engines.pool import EnginePool

    made = []
    real = EnginePool.__init__

    def spy(self, engines, **kwargs):
        made.append(kwargs)
        real(self, engines, **kwargs)

    monkeypatch.setattr(EnginePool, "__init__", spy)
    config = tmp_path / "pool.toml"
    config.write_text(f"model = '{MODEL}'\n[pool]\nprobe_timeout = 3.0\nrouting = 'random'\n")
    out = tmp_path / "run"
    result = cli("rollout", "--config", config, *SMALL, "--model", MODEL, "--model", MODEL,
                 "--routing", "least", "--probe-interval", "0.5", "--max-inflight", "8",
                 "--out", out)  # fmt: skip
    assert result.code == 0, result.err
    assert made[0]["routing"] == "least"  # the flag wins over the file
    assert made[0]["health_interval_s"] == 0.5 and made[0]["probe_timeout_s"] == 3.0
    assert made[0]["max_outstanding"] == 8
    recorded = tomllib.loads((out / "config.toml").read_text())["pool"]
    assert recorded["routing"] == "least" and recorded["probe_interval"] == 0.5


def test_bad_pool_settings_are_one_line_naming_the_flag_or_field(cli, tmp_path):
    result = cli("rollout", *SMALL, "--probe-interval", "0", "--out", tmp_path / "a")
    assert result.code == 2 and result.error.startswith("--probe-interval 0")
    path = tmp_path / "bad.toml"
    path.write_text("[pool]\nprobe_failures = 0\n")
    result = cli("rollout", "--config", path, "--out", tmp_path / "b")
    assert result.code == 2 and "probe_failures" in result.error
    path.write_text("[pool]\nprobe_every = 1\n")
    result = cli("rollout", "--config", path, "--out", tmp_path / "c")
    assert result.code == 2 and "probe_every" in result.error
