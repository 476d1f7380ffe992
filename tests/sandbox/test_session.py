"""Sessions: state between runs, what a run returns, restarts, the pool, closing."""

from __future__ import annotations

import asyncio
import time
import warnings

import pytest
from conftest import SMALL, descendants, require, wait_until

from loomrl.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxUnavailable
from loomrl.sandbox import bwrap as bwrap_mod
from loomrl.sandbox import sandbox as sandbox_mod
from loomrl.sandbox.session import cap_text, clean_text


async def test_variables_persist_and_a_final_expression_is_shown(sandbox):
    session = await sandbox.session()
    assert (await session.run("x = 40\ndef f(y):\n    return y + 2")).output == ""
    result = await session.run("f(x)")
    assert result == ExecResult(output="42\n", error=None, duration_s=result.duration_s, alive=True)
    assert result.text == "42"
    session.close()


async def test_stdout_and_stderr_interleave_and_the_traceback_is_the_users(sandbox):
    session = await sandbox.session()
    result = await session.run(
        "import sys\nprint('a')\nprint('b', file=sys.stderr)\nprint('c')\n1 / 0"
    )
    assert result.output == "a\nb\nc\n"
    assert result.error.splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert '<cell 1>", line 5' in result.error
    assert "repl_server" not in result.error and "<string>" not in result.error
    assert result.alive and not result.timed_out
    assert result.text == "a\nb\nc\n" + result.error
    syntax = await session.run("def broken(:")
    assert "SyntaxError" in syntax.error and syntax.alive
    leave = await session.run("import sys; sys.exit(3)")
    assert leave.error.endswith("SystemExit: 3") and leave.alive
    assert (await session.run("print('still here')")).output == "still here\n"
    session.close()


async def test_fd_level_output_of_subprocesses_is_captured(sandbox):
    session = await sandbox.session()
    result = await session.run(
        "import os, subprocess\nos.write(1, b'raw\\n')\n_ = subprocess.run(['echo', 'child'])"
    )
    assert result.output.splitlines() == ["raw", "child"]
    session.close()


async def test_a_timeout_kills_the_session_and_the_next_run_says_it_restarted(sandbox):
    session = await sandbox.session()
    await session.run("kept = 1")
    started = time.monotonic()
    result = await session.run("import time\nwhile True: time.sleep(0.01)", timeout=0.5)
    assert time.monotonic() - started < 3
    assert result.timed_out and not result.alive
    assert result.error.startswith("TimeoutError:") and "0.5 s wall time" in result.error
    after = await session.run("kept")
    assert after.restarted and after.alive
    assert "NameError" in after.error
    assert after.text.startswith("[a new Python interpreter was started")
    again = await session.run("1 + 1")
    assert not again.restarted and again.output == "2\n"
    session.close()


async def test_close_is_sync_idempotent_fast_and_leaves_nothing(sandbox, no_leftovers):
    session = await sandbox.session()
    await session.run("import subprocess\np = subprocess.Popen(['sleep', '300'])")
    assert len(descendants() - no_leftovers) >= 2  # the REPL side and its `sleep`
    started = time.perf_counter()
    session.close()
    assert time.perf_counter() - started < 1.0
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        await session.run("1")
    await sandbox.aclose()
    assert wait_until(lambda: descendants() <= no_leftovers)


async def test_concurrent_runs_on_one_session_take_turns(sandbox):
    session = await sandbox.session()
    await session.run("log = []")
    code = "import time\nlog.append('start {0}'); time.sleep(0.1); log.append('end {0}')"
    await asyncio.gather(*(session.run(code.format(i)) for i in range(3)))
    log = eval((await session.run("log")).output)
    assert [entry.split()[0] for entry in log] == ["start", "end"] * 3
    session.close()


async def test_sessions_are_isolated_from_each_other(sandbox):
    one, two = await sandbox.session(), await sandbox.session()
    await one.run("secret = 'one'\nopen('note.txt', 'w').write('one')")
    assert "NameError" in (await two.run("secret")).error
    seen = await two.run("import os\nos.path.exists('note.txt')")
    assert seen.output == "False\n"
    one.close()
    two.close()


async def test_the_pool_hands_out_warm_interpreters_and_counts(mode, make_sandbox):
    sb = make_sandbox(isolation=mode, pool_size=2, wall_s=2.0)
    assert sb.stats["started"] == 0  # creating a sandbox starts nothing
    first = await sb.session()  # nothing warm yet: cold, and the pool starts filling
    assert sb.stats["cold"] == 1 and sb.stats["warm"] == 0
    await asyncio.wait_for(sb.warm(), 10)
    assert sb.stats["idle"] == 2
    second = await sb.session()
    await second.run("print(1)")
    stats = sb.stats
    assert (stats["mode"], stats["cold"], stats["warm"], stats["calls"]) == (mode, 1, 1, 1)
    assert stats["sessions"] == 2 and stats["started"] >= 3
    await sb.aclose()
    assert sb.stats["alive"] == 0
    with pytest.raises(RuntimeError, match="closed"):
        await sb.session()
    first.close()  # after the sandbox: still fine


async def test_output_is_capped_in_the_middle_with_a_marker(sandbox):
    session = await sandbox.session()
    result = await session.run("print('A' * 10_000 + 'B' * 10_000)")
    assert result.truncated
    assert result.output.startswith("A" * 2048) and result.output.endswith("B" * 2047 + "\n")
    assert "bytes of output cut" in result.output
    assert len(result.output.encode()) < SMALL["output_bytes"] + 200
    session.close()


async def test_forged_frames_written_by_the_code_do_not_confuse_the_host(sandbox):
    """The code may write a well-formed frame to every fd it has, the protocol pipe
    included: the host ignores frames that do not answer its request and stays in step."""
    session = await sandbox.session()
    forged = (
        "import json, struct, os\n"
        "body = json.dumps({'id': 'guess', 'output': 'FORGED', 'error': None}).encode()\n"
        "for fd in range(3, 10):\n"
        "    try: os.write(fd, struct.pack('>I', len(body)) + body)\n"
        "    except OSError: pass\n"
        "print('real')"
    )
    result = await session.run(forged)
    assert result.alive and result.output != "FORGED" and "real\n" in result.output
    assert (await session.run("print(2)")).output == "2\n"
    garbage = await session.run(
        "import os\nfor fd in range(3, 10):\n"
        "    try: os.write(fd, b'\\xff' * 64)\n    except OSError: pass"
    )
    assert garbage.error is None or "protocol" in garbage.error
    assert (await session.run("print(3)")).output.endswith("3\n")
    session.close()


def test_host_side_text_is_valid_and_capped():
    assert clean_text("a\udc80b") == "a?b"
    assert clean_text(None) == "" and clean_text(7) == ""
    text, cut = cap_text("x" * 1000, 100)
    assert cut and text.startswith("x" * 50) and "900 bytes of output cut" in text
    assert cap_text("short", 100) == ("short", False)


def test_config_rejects_unknown_and_bad_fields():
    with pytest.raises(ValueError, match="extra"):
        SandboxConfig(memory=1)
    with pytest.raises(ValueError, match="isolation"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="wall_s"):
        SandboxConfig(wall_s=0)


def test_bwrap_required_but_unavailable_raises_with_the_reason(monkeypatch):
    monkeypatch.setattr(bwrap_mod, "probe", lambda: (False, "bwrap not found on PATH; install"))
    with pytest.raises(SandboxUnavailable, match="bwrap not found on PATH"):
        Sandbox(isolation="bwrap")


def test_auto_falls_back_loudly_and_says_how_to_fix(monkeypatch):
    monkeypatch.setattr(bwrap_mod, "probe", lambda: (False, "bwrap not found on PATH"))
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation") as caught:
        sb = Sandbox(isolation="auto")
    assert sb.mode == "rlimit-only" and sb.stats["mode"] == "rlimit-only"
    assert "apt-get install bubblewrap" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Sandbox(isolation="rlimit-only").mode == "rlimit-only"  # chosen: no warning


def test_auto_picks_bwrap_where_it_runs():
    require("bwrap")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Sandbox().mode == "bwrap"


def test_the_bwrap_command_binds_only_the_system_and_the_interpreter():
    python = bwrap_mod.interpreter()
    cmd = bwrap_mod.command(python, ["-c", "1"], tmp_mb=8, site_packages=False, env={"A": "b"})
    binds = [cmd[i + 2] for i, arg in enumerate(cmd) if arg == "--ro-bind"]
    assert all(
        b.startswith(("/usr", "/lib", "/bin", "/sbin", "/etc/ld.so.cache", python.prefix))
        for b in binds
    ), binds
    for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in cmd
    assert cmd[cmd.index("--tmpfs", cmd.index("--size")) + 1] == "/tmp"
    assert cmd[cmd.index("--chdir") + 1] == "/tmp"
    assert not any(path in binds for path in python.site_packages if path not in python.prefix)
    with_site = bwrap_mod.command(python, [], tmp_mb=8, site_packages=True, env={})
    assert all(path in with_site for path in python.site_packages)
    # A venv (or interpreter) under the host's /tmp is bound on top of the private /tmp,
    # not hidden by it: the tmpfs comes before every bind of the interpreter's paths.
    tmp_at = with_site.index("/tmp")
    for path in (*python.site_packages, python.prefix):
        assert with_site.index(path) > tmp_at, path


async def test_site_packages_only_when_asked(mode, make_sandbox):
    code = "import importlib.util\nimportlib.util.find_spec('pydantic') is not None"
    for asked, expected in ((False, "False\n"), (True, "True\n")):
        sb = make_sandbox(isolation=mode, pool_size=0, site_packages=asked)
        session = await sb.session()
        assert (await session.run(code)).output == expected


async def test_a_process_limit_is_reported(mode):
    sb = Sandbox(isolation=mode, pool_size=0)
    assert sb.stats["process_limit"] in (
        "pids cgroup",
        "RLIMIT_NPROC",
        "none (root ignores RLIMIT_NPROC and no pids cgroup is writable)",
    )
    sb.close()


def test_fallback_warning_names_what_is_not_protected():
    text = sandbox_mod.FALLBACK_WARNING
    assert "files" in text and "network" in text and "signal" in text


async def test_an_exception_with_a_huge_message_is_cut_and_the_session_lives(sandbox):
    session = await sandbox.session()
    await session.run("x = 5")
    result = await session.run("raise ValueError('y' * 10**6)")
    assert result.alive and "SandboxError" not in result.error, result.error
    assert result.error.splitlines()[-1].startswith("ValueError: yyy")
    assert "characters cut" in result.error and len(result.error) <= 8192
    line = await session.run("x = 1; s = '" + "z" * 10**6 + "'; 1 / 0")  # a huge source line
    assert line.alive and line.error.endswith("ZeroDivisionError: division by zero")
    assert (await session.run("print(x)")).output == "1\n"
    session.close()
