"""The Python REPL that runs inside the sandbox (standard library only).

Started as ``python -I -S -B -c SOURCE CONFIG_JSON TAG``. It talks to the host over
length-prefixed JSON frames on private copies of its stdin/stdout; the user code's
``sys.stdout``/``sys.stderr`` are capped in-memory buffers and file descriptors 1 and 2
point at an unnamed file in the working directory, so nothing user code prints can reach
the protocol pipe. It splits in two: a small supervisor (the parent, so that killing
``os.getppid()`` only kills the session) and the REPL, which dies with the supervisor.
"""

import ast
import contextlib
import ctypes
import io
import json
import linecache
import os
import resource
import signal
import struct
import sys
import traceback

HEADER = struct.Struct(">I")
MAX_REQUEST = 64 * 2**20
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
ERROR_LINES = 40
ERROR_LINE_CHARS = 1000  # a huge message or source line must not overflow the frame cap
ERROR_CHARS = 8192


def send(fd, obj):
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace")
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd):
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_REQUEST:
        return None
    body = read_exact(fd, size)
    return None if body is None else json.loads(body)


class Capture:
    """Keeps the first and last ``cap // 2`` bytes written and counts the rest."""

    def __init__(self, cap):
        self.half = cap // 2
        self.reset()

    def reset(self):
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0

    def add(self, data):
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self.half:
            self.dropped += len(self.tail) + len(data) - self.half
            self.tail = bytearray(data[-self.half :])
            return
        self.tail += data
        excess = len(self.tail) - self.half
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def add_file(self, fd):
        """Output written straight to fds 1/2 (subprocesses, C code) since the last call."""
        size = os.fstat(fd).st_size
        if size <= 2 * self.half:
            self.add(os.pread(fd, size, 0))
        else:
            self.add(os.pread(fd, self.half, 0))
            self.dropped += size - 2 * self.half
            self.add(os.pread(fd, self.half, size - self.half))
        os.ftruncate(fd, 0)

    def text(self):
        out = bytes(self.head)
        if self.dropped:
            out += f"\n[... {self.dropped} bytes of output cut ...]\n".encode()
        out += bytes(self.tail)
        return out.decode("utf-8", "replace")


class Binary(io.RawIOBase):
    def __init__(self, capture, fd):
        self.capture, self.fd = capture, fd

    def writable(self):
        return True

    def write(self, data):
        self.capture.add(bytes(data))
        return len(data)

    def fileno(self):
        return self.fd


class Stream(io.TextIOBase):
    """``sys.stdout`` / ``sys.stderr`` of user code: text into the shared capture."""

    encoding, errors = "utf-8", "replace"

    def __init__(self, capture, fd):
        self.capture, self.fd, self.buffer = capture, fd, Binary(capture, fd)

    def writable(self):
        return True

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.capture.add(text.encode("utf-8", "replace"))
        return len(text)

    def fileno(self):
        return self.fd

    def isatty(self):
        return False


class CPUTimeLimit(Exception):
    pass


def prctl(option, value):
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def set_limits(limits):
    r = resource
    resource.setrlimit(r.RLIMIT_CORE, (0, 0))
    for name in ("RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_NPROC", "RLIMIT_AS"):
        value = limits.get(name)
        if value is not None:
            resource.setrlimit(getattr(r, name), (value, value))
    hard = limits["RLIMIT_CPU"]
    resource.setrlimit(r.RLIMIT_CPU, (hard, hard))


def cpu_used():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def format_error(exc):
    """The traceback from the first cell frame on, without this server's own frames."""
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    try:
        summary = traceback.extract_tb(tb)
        summary = traceback.StackSummary.from_list(
            [f for f in summary if not (f.filename == "<string>" and f.name == "on_xcpu")]
        )
        lines = ["Traceback (most recent call last):\n", *summary.format()] if summary else []
        lines = "".join([*lines, *traceback.format_exception_only(type(exc), exc)]).splitlines()
    except BaseException:  # formatting itself may fail (memory): the type still helps
        return type(exc).__name__
    if len(lines) > ERROR_LINES:
        lines = ["Traceback (most recent call last, cut):", *lines[-ERROR_LINES + 1 :]]
    half = ERROR_LINE_CHARS // 2
    lines = [
        f"{ln[:half]}[... {len(ln) - 2 * half} characters cut ...]{ln[-half:]}"
        if len(ln) > ERROR_LINE_CHARS
        else ln
        for ln in lines
    ]
    return "\n".join(lines)[-ERROR_CHARS:]


def run_cell(code, namespace, number):
    filename = f"<cell {number}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:  # like a notebook: show the value of a final expression
        value = eval(compile(last, filename, "eval"), namespace)
        if value is not None:
            print(repr(value))


def repl(config, proto_in, proto_out, capture_fd):
    limits = config["limits"]
    capture = Capture(config["output_bytes"])
    sys.stdout, sys.stderr = Stream(capture, 1), Stream(capture, 2)
    sys.stdin = io.StringIO("")
    for path in config.get("paths", []):
        sys.path.append(path)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    calling = [False]
    cpu_s = limits["cpu_s"]

    def on_xcpu(_signum, _frame):
        if calling[0]:
            raise CPUTimeLimit(f"the call used more than {cpu_s:g} s of CPU time")

    signal.signal(signal.SIGXCPU, on_xcpu)
    set_limits(limits)
    hard = limits["RLIMIT_CPU"]
    send(proto_out, {"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    number = 0
    while True:
        request = recv(proto_in)
        if request is None:
            os._exit(0)
        number += 1
        capture.reset()
        error = None
        soft = min(hard, int(cpu_used() + cpu_s) + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        calling[0] = True
        try:
            run_cell(request["code"], namespace, number)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: keep serving
            error = format_error(exc)
        finally:
            calling[0] = False
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
        try:
            sys.__stdout__.flush()
            sys.__stderr__.flush()
        except Exception:
            pass
        capture.add_file(capture_fd)
        send(
            proto_out,
            {
                "id": request.get("id"),
                "output": capture.text(),
                "truncated": capture.dropped > 0,
                "error": error,
            },
        )


def descendants(root):
    """PIDs below ``root``, from /proc (orphans of the session are re-parented to us)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def kill_tree():
    for _ in range(5):  # a forking process may add a child meanwhile
        victims = descendants(os.getpid())
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def supervise(child, proto_out, workdir):
    """Reap until the REPL ends, tell the host why, then kill everything the session
    started; when the host dies (SIGTERM, our death signal) kill it all as well and
    remove the host-side working directory (``workdir``, rlimit-only), which the host
    can no longer remove."""

    def on_host_death(_signum, _frame):
        kill_tree()
        if workdir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        os._exit(1)

    signal.signal(signal.SIGTERM, on_host_death)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == child:
            break
    code = os.waitstatus_to_exitcode(status)
    with contextlib.suppress(OSError):
        send(proto_out, {"exit": code})
    kill_tree()
    os.killpg(0, signal.SIGKILL)


def main():
    config = json.loads(sys.argv[1])
    proto_in, proto_out = os.dup(0), os.dup(1)  # private, close-on-exec
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    workdir = config.get("workdir") or os.getcwd()
    os.chdir(workdir)
    try:
        capture_fd = os.open(workdir, os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError:  # file systems without O_TMPFILE: a file unlinked at once
        name = os.path.join(workdir, f".out-{os.getpid()}")
        capture_fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.unlink(name)
    os.set_blocking(capture_fd, True)
    import fcntl

    fcntl.fcntl(capture_fd, fcntl.F_SETFL, fcntl.fcntl(capture_fd, fcntl.F_GETFL) | os.O_APPEND)
    os.dup2(capture_fd, 1)
    os.dup2(capture_fd, 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # too big a file: EFBIG, not death
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the session stay below us
    host = config.get("host_pid")
    if host is not None and os.getppid() != host:
        os._exit(1)  # the host died before we could ask to die with it
    supervisor = os.getpid()
    child = os.fork()
    if child:
        os.close(proto_in)
        supervise(child, proto_out, config.get("workdir"))
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    prctl(PR_SET_CHILD_SUBREAPER, 0)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:
        os._exit(1)
    repl(config, proto_in, proto_out, capture_fd)


if __name__ == "__main__":
    main()
