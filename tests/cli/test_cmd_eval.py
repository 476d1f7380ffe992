"""``loomrl eval`` with scripted engines: a run directory, a checkpoint, a model spec,
the base model on a run's eval set; and one-line refusals before any engine starts."""

from __future__ import annotations

import json

import pytest

from loomrl.run.eval_tasks import eval_tasks
from loomrl.run.resume import resume_config
from loomrl.run.train_plan import draw_tasks
from loomrl.runs import read_trajectories
from loomrl.train.eval_set import content_key

METRICS = {"eval/reward_mean", "eval/pass@1", "eval/pass@k", "eval/sample_reward_mean",
           "eval/length_mean", "eval/reward/correct", "eval/reward/format"}  # fmt: skip


def questions(path):
    return [json.loads(r["messages"])[-2]["content"] if isinstance(r["messages"], str)
            else r["messages"][-2]["content"] for r in read_trajectories(path)]  # fmt: skip


def test_a_run_directory_is_scored_at_its_newest_checkpoint_on_its_held_out_set(
    cli, scripted, run, tmp_path
):
    out = tmp_path / "ev"
    result = cli("eval", "--model", run, "--examples", 4, "--n", 2, "--out", out)
    assert result.code == 0, result.err
    summary = json.loads((out / "eval.json").read_text())
    assert summary["step"] == 2 and summary["run"] == str(run) and summary["envs"] == ["arith"]
    assert summary["settings_run"] == str(run)
    assert summary["examples"] == 4 and summary["n"] == 2 and set(summary["metrics"]) == METRICS
    assert summary["model"] == str(run / "checkpoints" / "step-000002" / "model")
    assert len(read_trajectories(out / "greedy.parquet")) == 4
    assert len(read_trajectories(out / "sampled.parquet")) == 8
    assert "pass@2" in result.out and "pass@1" in result.out
    config = resume_config(run)
    drawn = draw_tasks(config)
    (task,) = eval_tasks(config.model_copy(update={"eval_examples": 4}), drawn)
    trained = {content_key(e) for e in drawn["arith"].examples}
    assert not trained & {content_key(e) for e in task.examples}
    assert questions(out / "greedy.parquet") == [e["question"] for e in task.examples]


def test_a_checkpoint_and_the_base_model_on_the_runs_eval_set(cli, scripted, run, tmp_path):
    step1 = run / "checkpoints" / "step-000001"
    result = cli("eval", "--model", step1, "--examples", 3, "--n", 1, "--out", tmp_path / "a")
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "a" / "eval.json").read_text())["step"] == 1
    base = cli("eval", "--model", "tiny-random", "--run", run, "--examples", 3, "--n", 1,
               "--out", tmp_path / "b")  # fmt: skip
    assert base.code == 0, base.err
    summary = json.loads((tmp_path / "b" / "eval.json").read_text())
    assert summary["model"] == "tiny-random" and summary["step"] is None
    assert summary["run"] is None and summary["settings_run"] == str(run)  # its settings, examples
    assert questions(tmp_path / "a" / "greedy.parquet") == questions(
        tmp_path / "b" / "greedy.parquet"
    )


def test_a_model_spec_with_an_env_and_a_data_file(cli, scripted, tmp_path):
    result = cli("eval", "--model", "tiny-random", "--env", "arith", "--env-args",
                 '{"max_operand": 3}', "--examples", 2, "--n", 3,
                 "--out", tmp_path / "a")  # fmt: skip
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "a" / "eval.json").read_text())["examples"] == 2
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    result = cli("eval", "--model", "tiny-random", "--env", "qa", "--data", data, "--n", 2,
                 "--out", tmp_path / "b")  # fmt: skip
    assert result.code == 0, result.err
    assert questions(tmp_path / "b" / "greedy.parquet") == ["1+1?", "2+2?"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "{tmp}/nowhere"], "nowhere"),
        (["--model", "{tmp}"], "neither a model directory"),
        (["--model", "{run}/checkpoints"], "neither a model directory"),
        (["--model", "{empty_run}"], "is a run directory with no checkpoint yet"),
        (["--model", "tiny-random"], "--env is required"),
        (["--model", "tiny-random", "--env", "no_such_env"], "no_such_env"),
        (["--model", "tiny-random", "--env", "arith", "--env-args", "{{x"],
         "--env-args {x: not JSON"),
        (["--model", "tiny-random", "--env", "arith", "--env-args", "[1]"], "a JSON object"),
        (["--model", "tiny-random", "--env", "arith", "--n", "0"], "--n 0: must be >= 1"),
        (["--model", "tiny-random", "--env", "qa"], "qa"),
        (["--model", "{run}", "--out", "{done}"], "already holds an evaluation"),
    ],
)  # fmt: skip
def test_bad_requests_are_one_line_before_any_engine(cli, run, tmp_path, argv, message):
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "eval.json").write_text("{}")
    names = {"tmp": tmp_path / "x", "run": run, "empty_run": tmp_path / "empty_run",
             "done": tmp_path / "done"}  # fmt: skip
    (tmp_path / "x").mkdir()
    argv = [a.format(**names) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    result = cli("eval", *argv)
    assert result.code == 2
    assert message in result.error
    assert not (tmp_path / "out").exists()


def test_a_damaged_checkpoint_is_named(cli, run, tmp_path):
    import shutil

    shutil.rmtree(run / "checkpoints" / "step-000002" / "model")
    result = cli("eval", "--model", run, "--out", tmp_path / "o")
    assert result.code == 2 and "step-000002/model is missing or has no config.json" in result.error


def test_a_lora_checkpoint_says_how_to_export_a_model(cli, run, tmp_path):
    import shutil

    step = run / "checkpoints" / "step-000002"
    shutil.rmtree(step / "model")
    (step / "adapter").mkdir()
    (step / "adapter" / "adapter_config.json").write_text("{}")
    result = cli("eval", "--model", step, "--out", tmp_path / "o")
    assert result.code == 2 and "is a LoRA checkpoint (adapter/, no model/)" in result.error
    assert "export_merged(" in result.error and not (tmp_path / "o").exists()


def test_train_refuses_evaluation_without_held_out_rows_before_it_starts(cli, tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    config = tmp_path / "t.toml"
    config.write_text(f'[train]\nmodel = "tiny-random"\nenv = "qa"\ndata = "{data}"\n'
                      "steps = 2\neval_every = 1\n")  # fmt: skip
    result = cli("train", config, "--out", tmp_path / "run")
    assert result.code == 2
    assert result.error.startswith("[train] data: evaluation needs examples the run does not")
    assert not (tmp_path / "run").exists()
