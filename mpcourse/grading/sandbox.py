"""A worker process for one submission, inside a bubblewrap sandbox, and the grader's end of its pipes.

The sandbox (`bwrap`, Debian's `bubblewrap` package) gives the worker:
- its own PID, network, IPC and UTS namespaces: no network at all, and no other process visible
  (not the grader, not a classmate's worker); killing it at the end kills everything it started;
- a filesystem of read-only system folders, the Python installation, the virtual environment
  and the `mpcourse` package, plus a small writable home (its work folder) and /tmp, both in
  memory and gone with it. Nothing else of the machine is there: not `solutions/`, other
  submissions, the gradebook or anyone's home;
- limits on memory, CPU time, file size, open files and processes (`worker.confine`) and, where
  the machine allows (`cgroup`), a control group of its own that counts all its memory (kernel
  buffers and tmpfs pages included) and all its threads;
- when the grader runs as root, a uid of its own (`sandbox_uid`), no other sandbox's: rlimits
  and kernel accounting per user (processes, pipe buffers) are then per sandbox;
- a seccomp filter (`seccomp`) refusing the calls whose effects escape those limits or outlive
  the sandbox: memfd, the kernel keyring, System V shared memory, new namespaces...;
- a count of its output bytes as they arrive.

Every reply is one JSON line echoing its request's number, read under the submission's deadline and a size cap: a
line over `Limits.reply` bytes, or of over `Limits.reply_items` JSON items (each would become a Python object),
stops the worker before any of it is parsed, and a line that does not end with the request's number is dropped
unparsed. A worker that dies, stalls, floods its output or answers nonsense is reported, never trusted.
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import re
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

from mpcourse.grading import seccomp
from mpcourse.grading.cgroup import Cgroup

WORKER = Path(__file__).with_name("worker.py")
FIRST_UID = 1_000_000_000  # sandbox uids: far above any real user's, below 2**31
_sandbox_numbers = itertools.count()
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
    resident: int = 3 << 30     # bytes of memory its control group may hold, kernel buffers included
    cpu: int = 600              # CPU seconds, all threads together
    file_size: int = 64 << 20   # bytes in any one file it writes
    home: int = 256 << 20       # bytes of its home folder, the work folder (in memory)
    tmp: int = 64 << 20         # bytes of its /tmp, and again of its /dev/shm (in memory)
    processes: int = 2048       # processes and threads of the sandbox (its uid, and its control group)
    open_files: int = 1024      # file descriptors per process (each socket or pipe holds kernel buffers)
    output: int = 32 << 20      # bytes printed before the worker is stopped
    reply: int = 16 << 20       # bytes in one reply line, read before any of it is parsed
    reply_items: int = 1 << 20  # JSON items (commas, lists, objects) in one reply line: what parsing builds


REPLY_END = re.compile(rb'"id":\s*(\d{1,12})\s*}\s*$')  # the worker writes the request's number last


class WorkerGone(Exception):
    """The worker died, stalled past the deadline, printed too much or broke the protocol."""


class RequestFailed(Exception):
    """The worker is alive but answered a request with a failure (a missing name, bad data...)."""


def sandbox_uid() -> int:
    """A uid no other sandbox of this machine holds now: from this process's id and a counter
    (64 sandboxes at once per grading process; a sandbox's processes all die with it)."""
    return FIRST_UID + (os.getpid() % (1 << 22)) * 64 + next(_sandbox_numbers) % 64


@functools.lru_cache(maxsize=None)
def sandbox_problem() -> str | None:
    """Why no sandbox can be made here (None when one can)."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap (`bwrap`) is not installed"
    try:
        program = seccomp.filter_fd()
    except ValueError as error:
        return str(error)
    try:
        done = subprocess.run(_bwrap(Limits(), program) + [sys.executable, "-I", "-c", "pass"], capture_output=True,
                              timeout=60, text=True, pass_fds=[program])
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap could not start: {error}"
    finally:
        os.close(program)
    if done.returncode != 0:
        return f"bwrap cannot create namespaces here: {done.stderr.strip()[:300]}"
    return None


def _bwrap(limits: Limits, seccomp_fd: int) -> list[str]:
    """The bubblewrap command line around a process that may write only its own small home, /tmp
    and /dev/shm, under the seccomp filter read from `seccomp_fd`."""
    root = os.geteuid() == 0
    args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--seccomp", str(seccomp_fd), "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.tmp), "--perms", "1777", "--tmpfs", "/dev/shm",
            "--size", str(limits.tmp), "--perms", "1777", "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr"]
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
        config = {"memory": limits.memory, "cpu": limits.cpu, "file_size": limits.file_size,
                  "open_files": limits.open_files}
        command, passed, self.cgroup = [sys.executable, "-I", str(WORKER)], [], None
        if sandboxed:  # its home and /tmp are small memory file systems that vanish with it
            self.workdir = None
            if os.geteuid() == 0:
                config.update(user=sandbox_uid(), processes=limits.processes)
                self.cgroup = Cgroup.create(limits.resident, limits.processes)
            else:  # the limit counts all this user's processes and threads, the grader's included
                config.update(processes=_tasks_of(os.geteuid()) + limits.processes)
            passed = [seccomp.filter_fd()]
            command = _bwrap(limits, passed[0]) + command
            if self.cgroup is not None:
                command = self.cgroup.wrap(command)
            env, cwd = {"PATH": "/usr/bin:/bin"}, "/"
        else:
            self.workdir = cwd = tempfile.mkdtemp(prefix="mpcourse-grade-")
            home = {"HOME": cwd, "IPYTHONDIR": os.path.join(cwd, ".ipython"), "MPLBACKEND": "Agg"}
            env = dict(os.environ, **home) if trusted else dict(home, PATH="/usr/bin:/bin", **kernel_environment())
        try:
            self.process = subprocess.Popen(command + [json.dumps(config)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                                            start_new_session=True, pass_fds=passed)
        except BaseException:
            if self.cgroup is not None:
                self.cgroup.remove()
            raise
        finally:
            for fd in passed:
                os.close(fd)
        self._buffer, self._requests = bytearray(), 0
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
        """The next reply that answers request `number`. A line is parsed only if it is under
        `limits.reply` bytes and ends with that number; others (a submission can write on this
        pipe too) are dropped unread, and an over-long line stops the worker."""
        fd = self.process.stdout.fileno()
        while True:
            end = self._buffer.find(b"\n")
            while end < 0:
                if len(self._buffer) > self.limits.reply:
                    raise self._gone(f"sent a reply line over {self.limits.reply >> 20} MiB")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    raise self._gone("timed out")
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise self._gone("died")
                searched = len(self._buffer)
                self._buffer += chunk
                end = self._buffer.find(b"\n", searched)
            if end > self.limits.reply:
                raise self._gone(f"sent a reply line over {self.limits.reply >> 20} MiB")
            line = bytes(self._buffer[:end])
            del self._buffer[:end + 1]
            tail = REPLY_END.search(line[-40:])
            if tail is None or int(tail.group(1)) != number:
                continue
            if line.count(b",") + line.count(b"[") + line.count(b"{") > self.limits.reply_items:
                raise self._gone(f"sent a reply of over {self.limits.reply_items:,} items")
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
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
