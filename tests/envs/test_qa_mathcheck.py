"""math-verify in killable child processes: answers, timeouts, dead children, threads,
the child's protocol, and what math-verify reads of a reply."""

from __future__ import annotations

import io
import json
import pickle
import sys
import threading

import pytest

from loomrl.answers.mathcheck import MathChecker, math_target
from loomrl.answers.mathverify import GoldError, serve
from loomrl.envs import load

TOWER = r"$\boxed{9^{9^{9}}}$"  # sympy computes a 370-million-digit integer, holding the GIL


@pytest.fixture(scope="module")
def checker():
    checker = MathChecker(timeout_s=2.0, workers=2)
    yield checker
    checker.close()


def test_equal_answers(checker):
    assert checker.equal(r"\frac{1}{2}", r"$\boxed{0.5}$") is True
    assert checker.equal("0.5", "$1/2$") is True
    assert checker.equal("0.5", "$1/3$") is False
    with pytest.raises(GoldError, match=r"cannot parse the reference answer '\$\$'"):
        checker.equal("$$", "$1$")


def test_a_runaway_check_is_killed_and_scores_zero(checker):
    before = checker.timeouts
    assert checker.equal("1", TOWER) is False
    assert checker.timeouts == before + 1
    assert checker.equal("3", r"$\boxed{3}$") is True  # a fresh child takes over


def test_a_dead_child_is_replaced(checker):
    checker.equal("1", "$1$")
    for child in list(checker._live):
        child.proc.kill()
        child.proc.wait()
    assert checker.equal("2", "$2$") is True


def test_concurrent_checks_from_threads(checker):
    results: dict[int, bool] = {}

    def check(i: int) -> None:
        results[i] = checker.equal(str(i), f"$\\boxed{{{i}}}$" if i % 2 else "$-1$")

    threads = [threading.Thread(target=check, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: bool(i % 2) for i in range(8)}
    assert len(checker._live) <= checker.workers


def test_pickling_keeps_settings_not_processes(checker):
    copy = pickle.loads(pickle.dumps(checker))
    assert (copy.timeout_s, copy.workers, copy._live) == (2.0, 2, set())
    env = pickle.loads(pickle.dumps(load("qa", math_timeout=3.0)))
    assert env.checker.timeout_s == 3.0


def test_a_forked_copy_starts_its_own_children(checker, monkeypatch):
    checker.equal("1", "$1$")
    parents = set(checker._live)
    monkeypatch.setattr("os.getpid", lambda: -1)  # as in a forked process
    assert checker.equal("1", "$1$") is True
    assert checker._live and not checker._live & parents
    assert all(child.proc.poll() is None for child in parents)  # left running
    for child in parents:
        child.kill()


def test_bad_settings():
    with pytest.raises(ValueError, match="timeout_s > 0"):
        MathChecker(timeout_s=0)
    with pytest.raises(ValueError, match="workers >= 1"):
        MathChecker(workers=0)


def test_the_child_protocol_in_process():
    out = io.StringIO()
    lines = [
        json.dumps({"gold": "0.5", "answer": r"$\frac{1}{2}$"}),
        json.dumps({"gold": "$$", "answer": "1"}),
        "not json",
    ]
    serve(io.StringIO("\n".join(lines) + "\n"), out)
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert replies[:3] == [
        {"ready": True},
        {"equal": True},
        {"gold_error": replies[2]["gold_error"]},
    ]
    assert replies[3]["error"].startswith("JSONDecodeError")


def test_the_child_reports_a_missing_math_verify(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    out = io.StringIO()
    serve(io.StringIO(""), out)
    assert "pip install 'loomrl[math]'" in json.loads(out.getvalue())["import_error"]


@pytest.mark.parametrize(
    ("reply", "target"),
    [
        (r"work \boxed{1} then \boxed{\frac{1}{2}}", r"$\boxed{\frac{1}{2}}$"),
        ("work\nAnswer: **1/2**.", "$1/2$"),
        ("Answer: $x^2$", "$x^2$"),
        ("I get 42", "I get 42"),
        (r"\boxed{}", None),
        ("Answer: **.**", None),
        ("   ", None),
        ("x" * 5000, "x" * 4000),  # no format: the tail
        (r"\boxed{" + "1" * 4001 + "}", None),  # an answer past max_chars is none
    ],
)
def test_what_math_verify_reads(reply, target):
    assert math_target(reply) == target
