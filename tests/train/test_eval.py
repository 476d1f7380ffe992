"""Evaluation: pass@k against hand counts and brute force, what passes, held-out eval
sets disjoint from the training pool, and evaluation inside the training loop (scripted
engine): a step-0 baseline row, eval metrics in the rows, files and the report."""

from __future__ import annotations

import itertools
import json
import math
import re

import pytest

from loomrl.algos.pass_at_k import mean_pass_at_k, pass_at_k
from loomrl.data import DataError
from loomrl.envs import load as load_env
from loomrl.report import build_report, load_run
from loomrl.run.eval_tasks import eval_tasks
from loomrl.run.train import train
from loomrl.run.train_plan import draw_tasks
from loomrl.run.train_report import report
from loomrl.runs import read_trajectories
from loomrl.train.config import TrainConfig
from loomrl.train.eval_set import content_key, eval_seed, held_out_of_env
from loomrl.train.evaluate import eval_due, eval_metrics, passed
from loomrl.types import Status, Trajectory

# (n, c, k, pass@k) worked by hand: 1 - C(n-c, k) / C(n, k)
HAND = [
    (4, 1, 1, 0.25),  # c/n
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (10, 3, 5, 1 - 21 / 252),  # C(7,5) = 21, C(10,5) = 252
    (4, 0, 4, 0.0),
    (4, 1, 4, 1.0),  # any 4 of 4 hold the pass
    (8, 4, 5, 1.0),  # n - c < k
]


@pytest.mark.parametrize(("n", "c", "k", "expected"), HAND)
def test_pass_at_k_matches_hand_computed_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_share_of_k_subsets_holding_a_pass():
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 1, 5), (4, 1, 0)]:
        with pytest.raises(ValueError, match=f"n={n}, c={c}, k={k}"):
            pass_at_k(n, c, k)
    assert mean_pass_at_k([[True, False], [False, False]], 2) == 0.5
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 1)


def traj(reward, components=None, status=Status.TERMINATED, tokens=3, example=0):
    return Trajectory(
        example_id=example, group_id=example, sample_index=0, env="e", reward=reward,
        reward_components=components or {}, status=status, spans=[(0, tokens)],
    )  # fmt: skip


def test_a_pass_is_correct_at_least_1_else_reward_over_the_threshold():
    assert passed(traj(0.1, {"correct": 1.0, "format": 0.1}), threshold=5.0)
    assert not passed(traj(1.1, {"correct": 0.0, "format": 1.1}), threshold=0.5)
    assert passed(traj(0.7), threshold=0.7) and not passed(traj(0.69), threshold=0.7)
    assert not passed(traj(1.0, {"correct": 1.0}, status=Status.ERROR), threshold=0.0)
    assert not passed(traj(1.0, status=Status.ENV_TIMEOUT), threshold=0.0)


def test_eval_metrics_greedy_means_and_unbiased_pass_at_k():
    ok, bad = {"correct": 1.0, "format": 0.1}, {"correct": 0.0, "format": 0.1}
    greedy = [traj(1.1, ok, tokens=4), traj(0.1, bad, tokens=8), traj(0.0, status=Status.ERROR)]
    sampled = [traj(1.1, ok), traj(0.1, bad), traj(0.1, bad),  # 1 of 3: pass@3 = 1
               traj(0.1, bad), traj(0.1, bad), traj(0.1, bad),  # 0 of 3
               traj(1.1, ok), traj(1.1, ok), traj(0.0, status=Status.ERROR)]  # fmt: skip
    m = eval_metrics(greedy, sampled, n=3, threshold=1.0)
    assert m["eval/pass@1"] == pytest.approx(1 / 3)
    assert m["eval/pass@k"] == pytest.approx(2 / 3)
    assert m["eval/reward_mean"] == pytest.approx(1.2 / 3)
    assert m["eval/sample_reward_mean"] == pytest.approx(3.8 / 9)
    assert m["eval/length_mean"] == pytest.approx(5.0)  # (4 + 8 + 3) / 3
    assert m["eval/reward/correct"] == pytest.approx(1 / 3)
    assert m["eval/reward/format"] == pytest.approx(0.2 / 3)
    with pytest.raises(ValueError, match="3 greedy and 8 sampled"):
        eval_metrics(greedy, sampled[:8], n=3, threshold=1.0)


def test_eval_runs_before_training_every_k_steps_and_after_the_last():
    assert [s for s in range(8) if eval_due(s, 3, 7)] == [0, 3, 6, 7]
    assert not any(eval_due(s, every, 7) for s in range(8) for every in (0, None))


def config(**overrides) -> TrainConfig:
    base = dict(
        model="tiny-random", env="arith", env_args={"max_operand": 5}, steps=4,
        prompts_per_step=2, n=3, max_tokens=8, max_len=256, checkpoint_every=2, lr=1e-3,
        eval_every=2, eval_examples=6, eval_n=3,
    )  # fmt: skip
    return TrainConfig(**{**base, **overrides})


def test_the_env_eval_set_is_disjoint_from_every_example_the_run_can_train_on():
    cfg = config(env_args={"max_operand": 9, "terms": 2}, steps=40, eval_examples=50)
    drawn = draw_tasks(cfg)
    (task,) = eval_tasks(cfg, drawn)
    train_keys = {content_key(e) for e in drawn["arith"].examples}
    eval_keys = [content_key(e) for e in task.examples]
    assert len(drawn["arith"].examples) == 384 and len(eval_keys) == 50 == len(set(eval_keys))
    assert not train_keys & set(eval_keys) and task.overlap == 0
    assert [e["id"] for e in task.examples] == list(range(50))
    env = load_env("arith", max_operand=9, terms=2)
    raw = [content_key(e) for e in env.dataset(50, seed=eval_seed(cfg.seed))]
    assert len(train_keys & set(raw)) > 10  # the small space collides: the filter is at work
    # a seed stream of its own: the training stream's first examples are not its first
    assert eval_seed(cfg.seed) != cfg.seed
    assert env.dataset(5, seed=eval_seed(0)) != env.dataset(5, seed=0)


def test_a_small_example_space_fills_from_overlapping_examples_and_counts_them():
    env = load_env("guess_number")  # 100 secrets
    train = env.dataset(2000, seed=0)
    examples, overlap = held_out_of_env(env, 10, 0, train)
    assert len(examples) == 10 and overlap == 10
    fresh, none = held_out_of_env(env, 10, 0, train[:20])
    assert none == 0 and not {content_key(e) for e in fresh} & {content_key(e) for e in train[:20]}


def test_data_eval_rows_are_the_held_out_rows_and_data_without_them_is_refused(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n"
                            for i in range(20)))  # fmt: skip
    held = config(env="qa", env_args={}, data={"path": str(path), "eval_size": 5})
    drawn = draw_tasks(held)
    (task,) = eval_tasks(held, drawn)
    trained = {e["question"] for e in drawn["qa"].examples}
    assert len(task.examples) == 5 and not trained & {e["question"] for e in task.examples}
    bare = config(env="qa", env_args={}, data=str(path))
    with pytest.raises(DataError, match=r"\[train\] data: evaluation needs .* eval_size"):
        eval_tasks(bare, draw_tasks(bare))
    own = config(env="qa", env_args={}, data=str(path), eval_data=str(path), eval_examples=3)
    (task,) = eval_tasks(own, draw_tasks(own))
    assert [e["question"] for e in task.examples] == ["q0", "q1", "q2"]


def test_eval_data_with_tasks_is_refused():
    with pytest.raises(ValueError, match="eval_data is the single env's"):
        config(env_args={}, tasks={"arith": {}}, eval_data="x.jsonl")


@pytest.fixture
def engines(tokenizer):
    """Greedy (temperature 0) answers 'Answer: 4' always; sampling cycles 0..6."""
    from loomrl.engines import ScriptedEngine

    made, answers = [], itertools.count()

    def make(model_dir, policy_version):
        def reply(prompt_ids, params):
            return "Answer: 4" if params.temperature == 0 else f"Answer: {next(answers) % 7}"

        engine = ScriptedEngine(reply, tokenizer=tokenizer)
        engine.set_policy_version(policy_version)
        made.append(engine)
        return engine

    make.made = made
    return make


async def test_training_evaluates_at_step_0_every_k_steps_and_at_the_end(tmp_path, engines):
    cfg = config(steps=3)
    rows = await train(cfg, tmp_path, make_engine=engines)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert set(rows[0]) == {"step", "eval_s", "eval_overlap", "eval_policy_version",
                            "eval/reward_mean", "eval/pass@1",
                            "eval/pass@k", "eval/sample_reward_mean", "eval/length_mean",
                            "eval/reward/correct", "eval/reward/format"}  # fmt: skip
    assert [("eval/pass@1" in r) for r in rows] == [True, False, True, True]
    assert [r.get("eval_policy_version") for r in rows] == [0, None, 2, 3]
    (task,) = eval_tasks(cfg, draw_tasks(cfg))
    fours = sum(e["answer"] == 4 for e in task.examples) / len(task.examples)
    for row in (rows[0], rows[2], rows[3]):
        assert row["eval/pass@1"] == pytest.approx(fours)  # greedy: 'Answer: 4' is all it says
        assert 0 <= row["eval/pass@k"] <= 1
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == rows
    greedy = read_trajectories(tmp_path / "eval" / "step-000002-greedy.parquet")
    sampled = read_trajectories(tmp_path / "eval" / "step-000002-sampled.parquet")
    assert len(greedy) == 6 and len(sampled) == 18
    assert {r["policy_version"] for r in greedy} == {2}  # after step 2's weight sync
    figures = json.loads(_figures(build_report([load_run(tmp_path)])))
    evals = next(f for f in figures if f["id"] == "eval")
    by_name = {t["name"]: t for t in evals["data"]}
    assert by_name["pass@1"]["x"] == [0, 2, 3] and "pass@k" in by_name
    assert "length_mean" not in by_name
    length = next(f for f in figures if f["id"] == "eval-length")
    assert length["data"][0]["x"] == [0, 2, 3]
    markdown = report(cfg, rows)  # report.md: the step-0 row is no training step
    assert "| 3 | " in markdown and "| 0 | " in markdown.split("Evaluation on held-out")[1]
    assert markdown.count("\n| 0 | ") == 1


async def test_a_resumed_run_keeps_its_baseline_and_does_not_evaluate_it_again(tmp_path, engines):
    class Crash(RuntimeError):
        pass

    def crash(row):
        if row["step"] == 3:
            raise Crash

    with pytest.raises(Crash):
        await train(config(), tmp_path, make_engine=engines, on_step=crash)
    rows = await train(config(), tmp_path, resume=True, make_engine=engines)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [("eval/pass@1" in r) for r in rows] == [True, False, True, False, True]
    assert math.isfinite(rows[4]["eval/pass@k"])


def _figures(page: str) -> str:
    """The report's figures block (as tests/report/html_blocks.py reads it)."""
    found = re.search(r"<script type='application/json' id='figures'>(.*?)</script>", page, re.S)
    assert found is not None
    return found.group(1)
