"""What an error line shows: URLs redacted (a secret in a flag, a config value or an
exception never reaches the terminal) and the exception's notes after its message."""

from __future__ import annotations

from loomrl.cli.output import one_line

SECRET_URL = "http://alice:pw-123@example.org/score?token=abc-777&model=m"


def test_a_secret_in_a_config_value_is_redacted_in_the_error(cli, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text(f'env = "arith"\n[env_args]\nterms = "{SECRET_URL}"\n')
    result = cli("rollout", "--config", config, "--out", tmp_path / "run")
    assert result.code == 2
    line = result.error
    assert "terms" in line and "example.org" in line  # still says what was wrong
    for secret in ("pw-123", "abc-777", "alice:"):
        assert secret not in result.out + result.err


def test_notes_follow_the_message_on_the_same_line():
    exc = ValueError("production failed\nin group 3")
    exc.add_note("production counted 4 failures (RuntimeError: 4): this one and 3 others")
    assert one_line(exc) == (
        "production failed in group 3; production counted 4 failures (RuntimeError: 4): "
        "this one and 3 others"
    )


def test_an_error_without_notes_is_its_message():
    assert one_line(ValueError("plain")) == "plain"


def test_a_learner_rank_that_died_is_one_line_and_exit_status_1(cli, monkeypatch):
    """A fault of the run (not of its input, exit status 2): named, no traceback."""
    import loomrl.cli.train as train_cli
    from loomrl.run.rank_group import LearnerRankError

    def dies(args):
        raise LearnerRankError("learner rank 1 exited (9); see its error above")

    monkeypatch.setattr(train_cli, "cmd_train", dies)
    monkeypatch.setattr("loomrl.cli.cmd_train", dies)
    result = cli("train", "--steps", "1")
    assert result.code == 1
    assert result.err.strip() == "error: learner rank 1 exited (9); see its error above"
