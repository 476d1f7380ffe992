"""`make test` collects the end-to-end tests from tests/e2e alone (importing every test
module costs ~20 s on CI's CPU): a test marked ``e2e`` anywhere else would never run."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).parent
MARK = "pytest.mark." + "e2e"  # spelled apart: this file is not an e2e module


def test_every_e2e_test_lives_in_tests_e2e():
    outside = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("*.py"))
        if path.relative_to(TESTS).parts[0] != "e2e" and MARK in path.read_text()
    ]
    assert outside == [], f"move these to tests/e2e (make test runs e2e from there): {outside}"


def test_every_module_in_tests_e2e_is_marked():
    unmarked = [
        path.name
        for path in sorted((TESTS / "e2e").glob("test_*.py"))
        if MARK not in path.read_text()
    ]
    assert unmarked == [], f"these would run with the unit tests: {unmarked}"


def test_no_two_test_modules_share_a_name():
    """Test modules import by basename (rootdir-relative, no packages): two of one name
    fail the unit run's collection."""
    seen: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(TESTS)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert twice == {}, f"rename one of each: {twice}"
