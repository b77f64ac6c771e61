"""A worker process for one submission, inside a bubblewrap sandbox, and the grader's end of its pipes.

The sandbox (`bwrap`, Debian's `bubblewrap` package) gives the worker:
- its own PID, network, IPC and UTS namespaces: no network at all, and no other process visible
  (not the grader, not a classmate's worker); killing it at the end kills everything it started;
- a filesystem of read-only system folders, the Python installation, the virtual environment
  and the `mpcourse` package, plus a small writable home (its work folder) and /tmp, both in
  memory and gone with it. Nothing else of the machine is there: not `solutions/`, other
  submissions, the gradebook or anyone's home;
- limits on memory, CPU time, file size and processes (`worker.confine`), an unprivileged user
  when the grader runs as root, and a count of its output bytes as they arrive.

Every reply is one JSON line echoing its request's number, read under the submission's deadline and a size cap; a worker
that dies, stalls, floods its output or answers nonsense is reported, never trusted.
"""
from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("worker.py")
NOBODY = 65534  # the unprivileged user a worker started as root becomes
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install "
                "bubblewrap`), or grade anyway, unprotected, with --unsafe-no-sandbox")


#: Environment variables that choose torch's kernels and thread counts. Behavioural tests compare
#: the learner's run with the solution's reference run to float tolerance, so both must compute
#: alike: the worker gets the grader's values of these (and nothing else of its environment).
KERNEL_ENVIRONMENT = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                      "ONEDNN_DEFAULT_FPMATH_MODE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                      "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def kernel_environment() -> dict[str, str]:
    """The grader's settings of `KERNEL_ENVIRONMENT`, for a worker to compute as the grader does."""
    return {name: os.environ[name] for name in KERNEL_ENVIRONMENT if name in os.environ}


@dataclass(frozen=True)
class Limits:
    """What one submission's worker may use."""
    memory: int = 6 << 30       # bytes of address space (torch alone maps about 1.5 GiB)
    cpu: int = 600              # CPU seconds, all threads together
    file_size: int = 64 << 20   # bytes in any one file it writes
    home: int = 256 << 20       # bytes of its home folder, the work folder (in memory)
    tmp: int = 64 << 20         # bytes of its /tmp (in memory)
    processes: int = 2048       # processes and threads of the sandbox user
    output: int = 32 << 20      # bytes printed before the worker is stopped
    reply: int = 256 << 20      # bytes in one reply


class WorkerGone(Exception):
    """The worker died, stalled past the deadline, printed too much or broke the protocol."""


class RequestFailed(Exception):
    """The worker is alive but answered a request with a failure (a missing name, bad data...)."""


@functools.lru_cache(maxsize=None)
def sandbox_problem() -> str | None:
    """Why no sandbox can be made here (None when one can)."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap (`bwrap`) is not installed"
    try:
        done = subprocess.run(_bwrap(Limits()) + [sys.executable, "-I", "-c", "pass"], capture_output=True,
                              timeout=60, text=True)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap could not start: {error}"
    if done.returncode != 0:
        return f"bwrap cannot create namespaces here: {done.stderr.strip()[:300]}"
    return None


def _bwrap(limits: Limits) -> list[str]:
    """The bubblewrap command line around a process that may write only its own small home and /tmp."""
    root = os.geteuid() == 0
    args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.tmp), "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr"]
    if not root:
        args.append("--unshare-user")
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = Path("/" + name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    import mpcourse
    needed = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
              str(Path(mpcourse.__file__).resolve().parent)}
    needed = sorted(path for path in needed if not path.startswith("/usr/"))
    for folder in sorted({str(parent) for path in needed for parent in Path(path).parents} - {"/"}):
        args += ["--perms", "0755", "--dir", folder]  # e.g. /root: traversable, its other files absent
    for path in needed:
        args += ["--ro-bind", path, path]
    return args + ["--perms", "0755", "--dir", "/home", "--size", str(limits.home), "--perms", "1777", "--tmpfs",
                   "/home/learner", "--chdir", "/home/learner", "--clearenv",
                   "--setenv", "HOME", "/home/learner", "--setenv", "PATH", "/usr/bin:/bin",
                   "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "MPLBACKEND", "Agg",
                   *[arg for name, value in kernel_environment().items() for arg in ("--setenv", name, value)],
                   "--"]


def _tasks_of(uid: int) -> int:
    """Threads of all processes that `uid` runs now (what RLIMIT_NPROC counts)."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


class Sandbox:
    """One worker process and its pipes. `request` sends a JSON request and returns the reply."""

    def __init__(self, limits: Limits, deadline: float, sandboxed: bool = True, trusted: bool = False):
        self.limits, self.printed, self.flooded, self.tail = limits, 0, False, b""
        config = {"memory": limits.memory, "cpu": limits.cpu, "file_size": limits.file_size}
        command = [sys.executable, "-I", str(WORKER)]
        if sandboxed:  # its home and /tmp are small memory file systems that vanish with it
            self.workdir = None
            if os.geteuid() == 0:
                config.update(user=NOBODY, processes=limits.processes)
            else:  # the limit counts all this user's processes and threads, the grader's included
                config.update(processes=_tasks_of(os.geteuid()) + limits.processes)
            command = _bwrap(limits) + command
            env, cwd = {"PATH": "/usr/bin:/bin"}, "/"
        else:
            self.workdir = cwd = tempfile.mkdtemp(prefix="mpcourse-grade-")
            home = {"HOME": cwd, "IPYTHONDIR": os.path.join(cwd, ".ipython"), "MPLBACKEND": "Agg"}
            env = dict(os.environ, **home) if trusted else dict(home, PATH="/usr/bin:/bin", **kernel_environment())
        self.process = subprocess.Popen(command + [json.dumps(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True)
        self._buffer, self._requests = b"", 0
        self._drain = threading.Thread(target=self._count_output, daemon=True)
        self._drain.start()
        try:
            self._receive(deadline)  # {"ready": true} once torch is loaded and the limits are set
        except WorkerGone:
            self.close()
            raise

    def _count_output(self):
        """Read and drop the learner's output, counting it; too much stops the worker."""
        for chunk in iter(lambda: self.process.stderr.read1(1 << 16), b""):
            self.printed += len(chunk)
            self.tail = (self.tail + chunk)[-2000:]
            if self.printed > self.limits.output and not self.flooded:
                self.flooded = True
                self.kill()

    def request(self, message: dict, deadline: float) -> dict:
        self._requests += 1
        data = (json.dumps(dict(message, id=self._requests)) + "\n").encode()
        try:
            self._send(data, deadline)
        except (BrokenPipeError, OSError):
            raise self._gone("stopped reading requests") from None
        reply = self._receive(deadline, self._requests)
        if "failed" in reply:
            raise RequestFailed(f"the submission's process could not serve {message.get('op')!r}: "
                                f"{str(reply['failed'])[:200]}")
        return reply

    def _send(self, data: bytes, deadline: float):
        fd = self.process.stdin.fileno()
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise self._gone("timed out")
            view = view[os.write(fd, view[: 1 << 16]):]

    def _receive(self, deadline: float, number: int = 0) -> dict:
        """The next reply that answers request `number`; lines that don't (a submission can write
        on this pipe too) are skipped."""
        fd = self.process.stdout.fileno()
        while True:
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    raise self._gone("timed out")
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise self._gone("died")
                self._buffer += chunk
                if len(self._buffer) > self.limits.reply:
                    raise self._gone(f"sent a reply over {self.limits.reply >> 20} MiB")
            line, self._buffer = self._buffer.split(b"\n", 1)
            try:
                reply = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if type(reply) is dict and reply.get("id") == number:
                return reply

    def _gone(self, what: str) -> WorkerGone:
        self.kill()
        self.process.wait()
        if self.flooded:
            what = f"printed more than {self.limits.output >> 20} MiB"
        elif what == "died" and self.process.returncode and self.process.returncode < 0:
            what = f"was killed by {signal.Signals(-self.process.returncode).name} (a crash or a limit)"
        elif what == "died":
            what = "died (os._exit, a crash or a limit)"
        if os.environ.get("MPCOURSE_GRADE_DEBUG"):
            print(f"[worker {what}, exit {self.process.returncode}] {self.tail.decode(errors='replace')}", file=sys.stderr)
        return WorkerGone(f"the submission's process {what}")

    def kill(self):
        """Stop the worker and everything it started (with the sandbox: its whole PID namespace)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self):
        """End of requests: the worker gets a moment to exit by itself, then the whole sandbox is
        killed, with whatever is left in it."""
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        self.process.wait()
        self._drain.join(timeout=5)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
