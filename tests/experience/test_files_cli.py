"""``loomrl experience RUN_DIR``: experience.parquet and experience_stats.json from a run
directory, against ``make_experience`` on the same trajectories; options, errors, ``--out``."""

from __future__ import annotations

import itertools
import json

import pyarrow.parquet as pq
import pytest
from contract import mask_runs

from loomrl import Environment, EnvStep, Status, Trajectory, rollout
from loomrl.algos import advantages as estimators
from loomrl.algos.advantages import AdvantageOutput
from loomrl.cli import main
from loomrl.experience import make_experience
from loomrl.experience.files import EXPERIENCE_SCHEMA, parse_options
from loomrl.runs import load_trajectories, write_run


def flat(text: str) -> str:
    """Rich wraps long lines at the console width; compare with spaces normalised."""
    return " ".join(text.split())


def make_traj(group: int, k: int, reward: float, mask: list[int], status=Status.TERMINATED):
    return Trajectory(
        example_id=100 + group, group_id=group, sample_index=k, env="hand",
        prompt_ids=[1, 2, 3][: 1 + k % 3], completion_ids=[20 + j for j in range(len(mask))],
        logprobs=[-0.25 if b else 0.0 for b in mask], loss_mask=mask, status=status,
        reward=reward, spans=(spans := mask_runs(mask)), span_versions=[k] * len(spans),
    )  # fmt: skip


@pytest.fixture
def run_dir(tmp_path):
    trajs = [
        make_traj(0, 0, 1.0, [1, 1, 0, 0, 1]),
        make_traj(0, 1, 0.0, [1, 0, 1]),
        make_traj(0, 2, float("nan"), [1, 1], status=Status.ERROR),
        make_traj(0, 3, 0.5, [1, 1, 1, 1]),
        make_traj(1, 0, 2.0, [1, 1]),
        make_traj(1, 1, 2.0, [1, 0, 0, 1]),
        make_traj(2, 0, 3.0, [1]),
        make_traj(2, 1, 1.0, [1, 1, 1], status=Status.ABORTED),
    ]
    out = tmp_path / "run"
    write_run(out, trajs, {"reward_mean": 1.0}, {"env": "hand"})
    return out


def read_rows(path):
    table = pq.read_table(path)
    assert table.schema.equals(EXPERIENCE_SCHEMA, check_metadata=False)
    return table.to_pylist()


def check_against_make_experience(out_dir, run_dir, estimator, **kwargs) -> dict:
    rows = read_rows(out_dir / "experience.parquet")
    exp = make_experience(load_trajectories(run_dir / "trajectories.parquet"), estimator, **kwargs)
    assert len(rows) == len(exp.trajectories) > 0
    for row, traj, adv, ret in zip(
        rows, exp.trajectories, exp.advantages, exp.returns, strict=True
    ):
        assert (row["example_id"], row["sample_index"]) == (traj.example_id, traj.sample_index)
        assert row["completion_ids"] == traj.completion_ids
        assert row["loss_mask"] == traj.loss_mask
        assert len(row["advantages"]) == len(row["returns"]) == len(traj.completion_ids)
        assert row["advantages"] == pytest.approx(adv, abs=1e-6)
        assert row["returns"] == pytest.approx(ret, abs=1e-6)
        assert row["reward"] == traj.reward and row["status"] == str(traj.status)
        assert row["policy_version"] == traj.policy_version
    stats = json.loads((out_dir / "experience_stats.json").read_text())
    assert stats["source"] == str(run_dir / "trajectories.parquet")
    assert stats["estimator"] == estimator
    for key in ("trajectories_in", "trajectories_used", "left_out_by_status", "options"):
        assert stats[key] == exp.stats[key]
    return stats


def test_experience_command_writes_what_make_experience_computes(run_dir, capsys):
    assert main(["experience", str(run_dir), "--estimator", "rloo"]) == 0
    assert "wrote" in flat(capsys.readouterr().out)
    stats = check_against_make_experience(run_dir, run_dir, "rloo")
    assert stats["left_out_by_status"] == {"error": 1, "aborted": 1}
    assert stats["trajectories_in"] == 8 and stats["trajectories_used"] == 6
    rows = read_rows(run_dir / "experience.parquet")
    # rloo by hand: group 0 is {1, 0, 0.5}; row 0 gets 1 - 0.25, on its model tokens only
    assert rows[0]["advantages"] == pytest.approx([0.75, 0.75, 0.0, 0.0, 0.75])
    assert rows[2]["advantages"] == pytest.approx([0.0] * 4)  # 0.5 - mean(1, 0)
    assert rows[5]["advantages"] == [0.0]  # group 2 is left with one member
    assert not list(run_dir.glob("*.tmp"))


def test_options_are_parsed_and_reach_the_estimator(run_dir):
    argv = ["experience", str(run_dir), "--estimator", "grpo", "--option", "scale=none"]
    assert main([*argv, "--option", "eps=0.001"]) == 0
    stats = check_against_make_experience(
        run_dir, run_dir, "grpo", options={"scale": "none", "eps": 0.001}
    )
    assert stats["options"] == {"scale": "none", "eps": 0.001}
    rows = read_rows(run_dir / "experience.parquet")
    assert rows[0]["advantages"][0] == pytest.approx(0.5)  # 1 - mean(1, 0, 0.5), unscaled


def test_drop_zero_variance_flag(run_dir):
    assert main(["experience", str(run_dir), "--estimator", "grpo", "--drop-zero-variance"]) == 0
    stats = check_against_make_experience(run_dir, run_dir, "grpo", drop_zero_variance=True)
    assert stats["zero_variance_groups_dropped"] == 2  # {2, 2} and the lone {3}
    assert [r["group_id"] for r in read_rows(run_dir / "experience.parquet")] == [0, 0, 0]


def test_out_writes_elsewhere(run_dir, tmp_path):
    out = tmp_path / "elsewhere" / "nested"
    assert main(["experience", str(run_dir), "--estimator", "rloo", "--out", str(out)]) == 0
    check_against_make_experience(out, run_dir, "rloo")
    assert not (run_dir / "experience.parquet").exists()
    assert not (run_dir / "experience_stats.json").exists()


def test_missing_run_dir_exits_2_with_a_message(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    assert main(["experience", str(missing), "--estimator", "rloo"]) == 2
    out = flat(capsys.readouterr().err)
    assert "error:" in out and "not found" in out and "loomrl run directory" in out
    assert "Traceback" not in out
    assert not missing.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--option", "scale"], "is not KEY=VALUE"),
        (["--option", "bogus=1"], "has no option(s) ['bogus']"),
        (["--estimator", "gae"], "needs ['values']"),
        (["--estimator", "nope"], "unknown advantage estimator 'nope'"),
    ],
)
def test_bad_requests_exit_2_and_write_nothing(run_dir, capsys, extra, message):
    assert main(["experience", str(run_dir), *extra]) == 2
    assert message in flat(capsys.readouterr().err)
    assert not (run_dir / "experience.parquet").exists()


def test_non_finite_advantages_are_refused(run_dir, monkeypatch, capsys):
    def always_nan(rewards, mask):
        nan = mask.double() * float("nan")
        return AdvantageOutput(nan, nan)

    monkeypatch.setitem(estimators._ESTIMATORS, "always_nan", always_nan)
    assert main(["experience", str(run_dir), "--estimator", "always_nan"]) == 2
    assert "estimator 'always_nan' with options {} gives non-finite advantages" in flat(
        capsys.readouterr().err
    )
    assert not (run_dir / "experience.parquet").exists()


@pytest.mark.parametrize(
    "pairs, expected",
    [
        (["scale=none"], {"scale": "none"}),
        (["eps=1e-4", "unbiased=false"], {"eps": 0.0001, "unbiased": False}),
        (["gamma=1", 'name="x"', "ids=[1, 2]"], {"gamma": 1, "name": "x", "ids": [1, 2]}),
        (["expr=a=b", " key =null"], {"expr": "a=b", "key": None}),
        (["empty="], {"empty": ""}),
        (["k=1", "k=2"], {"k": 2}),
        ([], {}),
    ],
)
def test_parse_options(pairs, expected):
    got = parse_options(pairs)
    assert got == expected
    assert all(type(got[k]) is type(v) for k, v in expected.items())


@pytest.mark.parametrize("pair", ["scale", "=none", " =1", ""])
def test_parse_options_rejects_malformed_pairs(pair):
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        parse_options([pair])


class TwoTurns(Environment):
    """Two assistant turns; the reward is the length of the answers, mod 5."""

    name = "two_turns"
    max_turns = 2

    def step(self, state, message):
        if state.turn >= 2:
            return EnvStep([], done=True)
        return EnvStep([{"role": "user", "content": "once more"}], done=False)

    def score(self, state):
        return float(sum(len(m) for m in state.assistant_messages()) % 5)


async def test_scripted_rollout_to_experience(make_engine, tmp_path):
    counter = itertools.count()
    engine = make_engine(lambda ids, params: "xy" * (1 + next(counter) % 4))
    trajs = await rollout(engine, TwoTurns(), [{"question": "Q0"}, {"question": "Q1"}], n=3)
    assert len(trajs) == 6 and all(0 in t.loss_mask for t in trajs)  # glue between turns
    write_run(tmp_path / "run", list(trajs), {}, {"env": "two_turns"})
    assert main(["experience", str(tmp_path / "run"), "--estimator", "grpo"]) == 0
    check_against_make_experience(tmp_path / "run", tmp_path / "run", "grpo")
    rows = read_rows(tmp_path / "run" / "experience.parquet")
    assert len({t.reward for t in trajs}) > 1
    assert any(a != 0.0 for row in rows for a in row["advantages"])
    for row, traj in zip(rows, trajs, strict=True):
        assert row["completion_ids"] == traj.completion_ids
        assert row["prompt_ids"] == traj.prompt_ids
        assert row["logprobs"] == pytest.approx(traj.logprobs, abs=1e-6)
        assert all(
            a == 0.0 for a, b in zip(row["advantages"], traj.loss_mask, strict=True) if not b
        )


# -- bad files and runs with nothing to use ---------------------------------------------------


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
    return lines[0].removeprefix("error: ")


def test_a_file_that_is_not_parquet_is_named(run_dir, capsys):
    source = run_dir / "trajectories.parquet"
    source.write_text("id,reward\n1,0.5\n")
    assert main(["experience", str(run_dir)]) == 2
    assert one_error_line(capsys).startswith(f"{source} is not a Parquet file (")


def test_wrong_schema_parquet_names_the_columns(run_dir, capsys):
    source = run_dir / "trajectories.parquet"
    table = pq.read_table(source)
    pq.write_table(table.drop_columns(["loss_mask", "status"]), source)
    assert main(["experience", str(run_dir)]) == 2
    assert one_error_line(capsys) == (
        f"{source} is not a loomrl trajectories file: it lacks columns ['loss_mask', 'status'] "
        "(schema in docs/parquet.md)"
    )
    index = table.schema.get_field_index("reward")
    pq.write_table(table.set_column(index, "reward", table.column("reward").cast("string")), source)
    assert main(["experience", str(run_dir)]) == 2
    assert one_error_line(capsys) == (
        f"{source}: column 'reward' is string, not double (schema in docs/parquet.md)"
    )
    assert not (run_dir / "experience.parquet").exists()


def test_files_from_before_the_span_columns_still_load(run_dir):
    source = run_dir / "trajectories.parquet"
    table = pq.read_table(source)
    old = ["span_starts", "span_ends", "span_versions", "finish_reasons"]
    pq.write_table(table.drop_columns(old), source)
    assert main(["experience", str(run_dir), "--estimator", "rloo"]) == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--option", "scale=bogus"],
            "estimator 'grpo': option scale = 'bogus' is not Literal['group', 'batch', 'none'] "
            "(Input should be 'group', 'batch' or 'none'; values are JSON",
        ),
        (["--option", "eps=x"], "estimator 'grpo': option eps = 'x' is not float (Input should"),
        (["--estimator", "nope"], "unknown advantage estimator 'nope'; known: gae, grpo"),
    ],
)
def test_options_are_checked_before_the_run_is_read(tmp_path, capsys, extra, message):
    missing = tmp_path / "no-such-run"  # the request is refused before the run is looked at
    assert main(["experience", str(missing), *extra]) == 2
    assert one_error_line(capsys).startswith(message)


def test_a_run_whose_trajectories_all_failed_exits_with_the_reason(tmp_path, capsys):
    failed = [
        make_traj(0, 0, float("nan"), [1], status=Status.ERROR),
        make_traj(0, 1, float("nan"), [1], status=Status.ENV_TIMEOUT),
        make_traj(1, 0, float("nan"), [1, 1], status=Status.ERROR),
    ]
    write_run(tmp_path / "run", failed, {}, {"env": "hand"})
    assert main(["experience", str(tmp_path / "run")]) == 2
    source = tmp_path / "run" / "trajectories.parquet"
    assert one_error_line(capsys) == (
        f"{source}: no usable trajectory: all 3 ended as aborted/env_timeout/error "
        "(1 env_timeout, 2 error); see their 'error' column"
    )
    assert not (tmp_path / "run" / "experience.parquet").exists()


def test_a_run_left_empty_by_drop_zero_variance_exits_with_the_reason(tmp_path, capsys):
    flat_groups = [make_traj(g, k, 1.0, [1]) for g in range(2) for k in range(2)]
    flat_groups.append(make_traj(2, 0, float("nan"), [1], status=Status.ERROR))
    write_run(tmp_path / "run", flat_groups, {}, {"env": "hand"})
    argv = ["experience", str(tmp_path / "run"), "--drop-zero-variance"]
    assert main(argv) == 2
    assert one_error_line(capsys).endswith(
        "no usable trajectory: --drop-zero-variance dropped all 2 groups (every group's "
        "rewards agree) and 1 trajectories failed"
    )
    assert main(argv[:-1]) == 0  # without the flag the same run is usable


def test_a_train_run_is_told_apart_from_a_missing_run(tmp_path, capsys):
    run = tmp_path / "train-run"
    (run / "trajectories").mkdir(parents=True)
    assert main(["experience", str(run)]) == 2
    err = flat(capsys.readouterr().err)
    assert "is a `loomrl train` run" in err and "trajectories/step-NNNNNN.parquet" in err
    assert main(["experience", str(tmp_path / "nothing")]) == 2
    assert "nothing a loomrl run directory?" in flat(capsys.readouterr().err)
