"""`loomrl rollout` as a user runs it, refusing a bad config before any engine starts.
(A complete run directory from a real engine is checked in ``test_cli_resume``.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_cli_rejects_bad_config_with_a_clear_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("examples = 0\n")
    done = subprocess.run(
        [sys.executable, "-m", "loomrl.cli", "rollout", "--config", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "examples" in done.stderr
