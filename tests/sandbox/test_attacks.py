"""Attacks by model-written code. Each: the run returns an ExecResult with a clear error
within its limits (pytest-timeout guards against hangs), the host is untouched, and no
process is left (the ``sandbox`` fixture checks the test's process tree afterwards).

In rlimit-only mode some attacks cannot be stopped (reading the host's files, the
network, /proc/1/root): those tests assert the behaviour docs/tools.md documents."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import SMALL, require, sandbox_processes, wait_until

pytestmark = pytest.mark.timeout(60)
HERE = Path(__file__).parent


async def run(sandbox, code: str, **kw):
    """(result, session) of ``code`` on a new session of ``sandbox``."""
    session = await sandbox.session()
    return await session.run(code, **kw), session


async def test_fork_bomb_is_stopped_by_the_process_limit(sandbox):
    if sandbox.process_limit.startswith("none"):
        if os.environ.get("CI") == "true":  # a CI machine must enforce it: never hide that
            pytest.fail(f"no process limit on CI: {sandbox.process_limit}")
        pytest.skip(f"no process limit here: {sandbox.process_limit}")
    session = await sandbox.session()
    counted = await session.run(
        "import os, time\nn = 0\nwhile True:\n"
        "    try: pid = os.fork()\n    except OSError as e: print(n, e.errno); break\n"
        "    if pid == 0: time.sleep(60); os._exit(0)\n    n += 1"
    )
    forks, errno = map(int, counted.output.split())
    assert errno == 11  # EAGAIN
    assert 0 < forks <= SMALL["max_procs"]
    bomb = await session.run("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass")
    assert bomb.timed_out and not bomb.alive and "wall time" in bomb.error
    session.close()


async def test_infinite_loop_hits_the_cpu_limit_and_the_session_lives(mode, make_sandbox):
    sb = make_sandbox(isolation=mode, cpu_s=1, wall_s=30.0, pool_size=0)
    session = await sb.session()
    result = await session.run("while True: pass")
    assert "CPUTimeLimit: the call used more than 1 s of CPU time" in result.error
    assert result.alive and not result.timed_out and result.duration_s < 30
    assert (await session.run("print('after')")).output == "after\n"


async def test_memory_bomb_is_a_memory_error(sandbox):
    session = await sandbox.session()
    result = await session.run("x = bytearray(1 << 30)")
    assert result.error.splitlines()[-1] == "MemoryError" and result.alive
    grow = await session.run("chunks = []\nwhile True: chunks.append(b' ' * (1 << 20))")
    assert grow.error.endswith("MemoryError") and grow.alive
    assert (await session.run("del chunks\nprint('ok')")).output == "ok\n"
    session.close()


async def test_a_gigabyte_of_output_is_capped(sandbox):
    session = await sandbox.session()
    result = await session.run(
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024): sys.stdout.write(chunk)"
    )
    assert result.truncated and result.alive and result.error is None
    assert "bytes of output cut" in result.output
    assert len(result.output) < SMALL["output_bytes"] + 200
    raw = await session.run(
        "import os\nchunk = b'y' * (1 << 20)\nfor _ in range(1024): os.write(1, chunk)"
    )
    assert "File too large" in raw.error  # fd-level output is a file capped by RLIMIT_FSIZE
    assert raw.truncated or len(raw.output) <= SMALL["output_bytes"] + 200
    session.close()


async def test_a_huge_file_stops_at_the_file_size_limit(sandbox, tmp_path):
    session = await sandbox.session()
    result = await session.run(
        "f = open('big.bin', 'wb')\nfor _ in range(1024): f.write(b'0' * (1 << 20)); f.flush()"
    )
    assert "File too large" in result.error and result.alive
    size = await session.run("import os\nos.path.getsize('big.bin')")
    assert int(size.output) <= SMALL["file_size_mb"] << 20
    session.close()


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    yield server
    server.close()


def accepted(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


async def test_network_loopback_of_the_host(sandbox, listener):
    port = listener.getsockname()[1]
    result, session = await run(
        sandbox, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
    )
    if sandbox.mode == "bwrap":
        assert "ConnectionRefusedError" in result.error  # its own, empty loopback
        assert not accepted(listener)
    else:  # documented: the fallback has the host's network
        assert result.error is None
        assert wait_until(lambda: accepted(listener), 2)
    session.close()


async def test_network_outside(bwrap_sandbox):
    result, session = await run(
        bwrap_sandbox, "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)"
    )
    assert "Network is unreachable" in result.error
    dns, _ = await run(bwrap_sandbox, "import socket\nsocket.getaddrinfo('pypi.org', 443)")
    assert "gaierror" in dns.error
    session.close()


async def test_reading_etc_shadow_and_the_run_directory(sandbox, tmp_path):
    secret = tmp_path / "run" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("run-dir-secret")
    result, session = await run(
        sandbox,
        f"out = []\nfor p in ('/etc/shadow', {str(secret)!r}):\n"
        "    try: out.append(len(open(p).read()))\n"
        "    except OSError as e: out.append(type(e).__name__)\nout",
    )
    shadow, run_dir = eval(result.output)
    if sandbox.mode == "bwrap":
        assert (shadow, run_dir) == ("FileNotFoundError", "FileNotFoundError")
    else:  # documented: the fallback sees what this user sees
        assert run_dir == len("run-dir-secret")
        if os.path.exists("/etc/shadow"):
            assert shadow == (
                "PermissionError" if os.geteuid() else len(Path("/etc/shadow").read_text())
            )
    assert secret.read_text() == "run-dir-secret"
    session.close()


async def test_killing_the_parent_kills_only_the_session(sandbox):
    result, session = await run(
        sandbox, "import os\nos.kill(os.getppid(), 9)\nimport time; time.sleep(5)"
    )
    assert not result.alive and not result.timed_out
    assert result.error.startswith("SandboxError: the sandboxed interpreter")
    after = await session.run("print('back')")
    assert after.restarted and after.output == "back\n"
    session.close()


async def test_escaping_through_proc_1_root(bwrap_sandbox, tmp_path):
    (tmp_path / "host.txt").write_text("host")
    result, session = await run(
        bwrap_sandbox,
        "import os\nout = [sorted(os.listdir('/proc/1/root'))]\n"
        f"for p in ('/proc/1/root/etc/shadow', '/proc/1/root{tmp_path / 'host.txt'}'):\n"
        "    try: open(p).read(); out.append('read')\n"
        "    except OSError as e: out.append(type(e).__name__)\nout",
    )
    listing, shadow, host = eval(result.output)
    assert not {"home", "work", "var", "opt"} & set(listing)
    assert shadow != "read" and host != "read"
    session.close()


async def test_ctypes_segfault_is_a_crash_report(sandbox):
    result, session = await run(sandbox, "import ctypes\nctypes.string_at(0)")
    assert not result.alive
    assert "segmentation fault" in result.error
    assert (await session.run("1 + 1")).output == "2\n"
    session.close()


async def test_ctypes_kill_everything_and_ptrace_stay_inside(bwrap_sandbox):
    sentinel = subprocess.Popen(["sleep", "60"])
    try:
        traced, session = await run(
            bwrap_sandbox,
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"libc.ptrace(16, {os.getpid()}, 0, 0), ctypes.get_errno()",
        )
        assert traced.output == "(-1, 3)\n"  # ESRCH: the host's PIDs do not exist in here
        result = await session.run(  # everyone but itself: its supervisor's death ends it
            "import ctypes, time\nctypes.CDLL(None).kill(-1, 9)\ntime.sleep(5)"
        )
        assert not result.alive
        assert sentinel.poll() is None and psutil.pid_exists(os.getpid())
        session.close()
    finally:
        sentinel.kill()
        sentinel.wait()


async def test_sleeping_past_the_timeout(sandbox):
    started = time.monotonic()
    result, session = await run(sandbox, "import time\ntime.sleep(30)")
    assert result.timed_out and not result.alive
    assert time.monotonic() - started < SMALL["wall_s"] + 3
    assert "exceeded 2 s wall time" in result.error
    session.close()


async def test_unicode_and_binary_output_come_back_as_valid_text(sandbox):
    result, session = await run(
        sandbox,
        "import os, sys\nprint('héllo ✓ 🐍 \\udc80 \\x00')\n"
        "sys.stdout.buffer.write(bytes(range(256)))\nos.write(1, b'\\xff\\xfe\\xc3')",
    )
    assert result.error is None
    result.output.encode("utf-8")  # valid: no lone surrogates
    assert "héllo ✓ 🐍" in result.output and "\ufffd" in result.output
    session.close()


async def test_a_daemonized_grandchild_dies_with_the_session(sandbox, no_leftovers):
    result, session = await run(
        sandbox,
        "import subprocess\n"
        "p = subprocess.Popen(['sh', '-c', 'sleep 300 & echo $!'], start_new_session=True, "
        "stdout=subprocess.PIPE)\nprint(p.stdout.readline().decode().strip())",
    )
    assert result.output.strip().isdigit()
    session.close()
    await sandbox.aclose()
    assert wait_until(lambda: not [p for p in sandbox_processes() if _mine(p)])


def _mine(proc: psutil.Process) -> bool:
    try:
        return f"loomrl-sandbox:{os.getpid()}:" in proc.environ().get("LOOMRL_SANDBOX", "")
    except psutil.Error:
        return False


@pytest.mark.parametrize("mode", ["bwrap", "rlimit-only"])
def test_nothing_survives_a_kill_9_of_the_host(mode):
    require(mode)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(HERE / "orphan_child.py"), mode],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == -9, done.stderr
    tag, workdir = done.stdout.split()
    assert tag.startswith("loomrl-sandbox:")
    prefix = ":".join(tag.split(":")[:2]) + ":"  # every session of that host process

    def survivors() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                marked = any(prefix in part for part in proc.info["cmdline"] or ()) or (
                    prefix in proc.environ().get("LOOMRL_SANDBOX", "")
                )
                if marked and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                pass
        return found

    assert wait_until(lambda: not survivors(), 5), [p.cmdline() for p in survivors()]
    if mode == "rlimit-only":  # its temporary working directory on the host goes too
        assert wait_until(lambda: not os.path.exists(workdir), 5), workdir


async def test_filling_memory_through_writable_mounts_is_capped(make_sandbox):
    """Every writable file system inside is a tmpfs (host memory): each must be read-only
    or capped at ``tmp_mb``, else many files under the per-file limit fill the host's RAM."""
    require("bwrap")
    sb = make_sandbox(isolation="bwrap", **{**SMALL, "tmp_mb": 8})
    site = Path(sb.python.stdlib) / "site-packages"
    result, session = await run(
        sb,
        "import os\nout = {}\n"
        f"for d in ('/', '/etc', '/dev', '/dev/shm', '/tmp', {str(site)!r}):\n"
        "    n = 0\n"
        "    try:\n"
        "        for i in range(6):\n"
        "            with open(os.path.join(d, f'fill{i}'), 'wb') as f: f.write(b'0' * (4 << 20))\n"
        "            n += 4\n"
        "    except OSError as e: pass\n"
        "    out[d] = n\nout",
    )
    written = eval(result.output)
    assert all(mb <= 8 for mb in written.values()), written
    assert written["/tmp"] >= 4 and written["/dev/shm"] >= 4  # still usable
    multi = await session.run(
        "import glob, multiprocessing, os\nfor f in glob.glob('/dev/shm/fill*'): os.remove(f)\n"
        "multiprocessing.Lock()\nprint('ok')"
    )
    assert multi.output == "ok\n", multi.error
    session.close()
