"""A worker process for one submission, inside a sandbox, and the grader's end of its pipes.

Two sandboxes, behind one interface (`choose_isolation`, then `Sandbox`), in order of preference:

**bubblewrap** (`bwrap`, Debian's `bubblewrap` package), where the kernel lets it make namespaces.
It gives the worker:
- its own PID, network, IPC and UTS namespaces: no network at all, and no other process visible
  (not the grader, not a classmate's worker); killing it at the end kills everything it started;
- a filesystem of read-only system folders, the Python installation, the virtual environment
  and the `mpcourse` package, plus a small writable home (its work folder) and /tmp, both in
  memory and gone with it. Nothing else of the machine is there: not `solutions/`, other
  submissions, the gradebook or anyone's home.

**an unprivileged user** (`unprivileged-user`), for a grader running as root where namespaces
are refused (Docker's default seccomp profile, so Gradescope's containers): the worker runs as a
uid of its own, in a private work folder (mode 0700, its own) with TMPDIR there, and, if
`unshare` is allowed, without network. Where the kernel has Landlock (`landlock`), the worker
walls itself in before any learner code runs: it reads only the system folders, Python, the
virtual environment and the `mpcourse` package, writes only its folder, and (Landlock ABI 4+)
has no TCP. Without Landlock it sees the machine's files as any unprivileged user does: what the
grader must keep from it (solutions, /autograder/source, results) must then not be readable by
others (`unreachable_by_others`). `Isolation.gaps` lists what it leaves shared.

Both give:
- limits on memory, CPU time, file size, open files and processes (`worker.confine`) and, where
  the machine allows (`cgroup`), a control group of its own that counts all its memory (kernel
  buffers and tmpfs pages included), all its threads, and holds one CPU weight for all its
  processes, so a sandbox full of spinners gets the CPU share of one classmate;
- when the grader runs as root, a uid of its own (`sandbox_uid`), no other sandbox's: rlimits
  and kernel accounting per user (processes, pipe buffers) are then per sandbox;
- a seccomp filter (`seccomp`) refusing the calls whose effects escape those limits or outlive
  the sandbox: memfd, the kernel keyring, System V shared memory, new namespaces...;
- time budgets in CPU time of the whole sandbox (`Budget`), with a wall-clock backstop
  `WALL_FACTOR` times larger: a busy machine slows a submission without running its budget down;
- a count of its output bytes as they arrive.

Every reply is one JSON line echoing its request's number, read under the budget and a size cap: a
line over `Limits.reply` bytes, or of over `Limits.reply_items` JSON items (each would become a Python object),
stops the worker before any of it is parsed, and a line that does not end with the request's number is dropped
unparsed. A worker that dies, stalls, floods its output or answers nonsense is reported, never trusted.
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mpcourse.grading import landlock, seccomp
from mpcourse.grading.cgroup import Cgroup

WORKER = Path(__file__).with_name("worker.py")
FIRST_UID = 1_000_000_000  # sandbox uids: far above any real user's, below 2**31
WALL_FACTOR = 5.0  # a budget's wall-clock backstop, in multiples of its CPU seconds
POLL = 0.25  # seconds between two readings of a sandbox's CPU time while the grader waits
_sandbox_numbers = itertools.count()
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install "
                "bubblewrap`), or grade anyway, unprotected, with --unsafe-no-sandbox")
BUBBLEWRAP, USER, NONE = "bubblewrap", "unprivileged-user", "none"


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
    cpu: int = 600              # CPU seconds of any one process, all its threads together
    file_size: int = 64 << 20   # bytes in any one file it writes
    home: int = 256 << 20       # bytes of its home folder, the work folder (in memory)
    tmp: int = 64 << 20         # bytes of its /tmp, and again of its /dev/shm (in memory)
    processes: int = 2048       # processes and threads of the sandbox (its uid, and its control group)
    open_files: int = 1024      # file descriptors per process (each socket or pipe holds kernel buffers)
    output: int = 32 << 20      # bytes printed before the worker is stopped
    reply: int = 16 << 20       # bytes in one reply line, read before any of it is parsed
    reply_items: int = 1 << 20  # JSON items (commas, lists, objects) in one reply line: what parsing builds


class Budget:
    """Time for one stretch of a sandbox's work (its start and cells, one test...): `cpu` seconds
    of CPU time of the sandbox as a whole (every process and thread in it, `setsid` or not), and
    a wall-clock backstop `wall_factor` times larger, counted from now, for a sandbox that waits
    (a `sleep`, a blocked read) instead of computing. `what` names the stretch in reasons.

    CPU time is counted from the moment the budget first applies to a sandbox, per sandbox."""

    def __init__(self, cpu: float, what: str = "", wall_factor: float = WALL_FACTOR):
        self.cpu, self.what, self.wall = float(cpu), what, float(cpu) * wall_factor
        self.wall_end = time.monotonic() + self.wall
        self._start: dict[int, float] = {}

    @classmethod
    def wall_clock(cls, deadline: float) -> Budget:
        """A bare wall-clock deadline (a `time.monotonic()` value), as older callers pass one."""
        budget = cls(math.inf)
        budget.wall, budget.wall_end = max(0.0, deadline - time.monotonic()), deadline
        return budget

    def describe(self) -> str:
        """'a budget of 30 s of CPU time (150 s of wall clock at most)'."""
        if math.isinf(self.cpu):
            return f"a deadline of {self.wall:.0f} s"
        return f"a budget of {self.cpu:g} s of CPU time ({self.wall:.0f} s of wall clock at most)"

    def overrun(self, sandbox: Sandbox) -> str | None:
        """Why this budget is spent for `sandbox` (None while it is not)."""
        used = sandbox.cpu_seconds()
        start = self._start.setdefault(id(sandbox), used)
        if used - start > self.cpu:
            return f"ran past its budget of {self.cpu:g} s of CPU time (an endless loop?)"
        if time.monotonic() >= self.wall_end:
            if math.isinf(self.cpu):
                return f"ran past its deadline of {self.wall:.0f} s"
            return (f"ran past the {self.wall:.0f} s wall-clock backstop of its {self.cpu:g} s CPU budget, "
                    f"having used {used - start:.0f} s of CPU (it waits, or the machine is over "
                    f"{self.wall / self.cpu:g}x busy)")
        return None

    def wait(self) -> float:
        """How long the grader may block before looking at the sandbox's CPU time again."""
        return max(0.0, min(POLL, self.wall_end - time.monotonic()))


def as_budget(deadline: Budget | float) -> Budget:
    return deadline if isinstance(deadline, Budget) else Budget.wall_clock(deadline)


REPLY_END = re.compile(rb'"id":\s*(\d{1,12})\s*}\s*$')  # the worker writes the request's number last


class WorkerGone(Exception):
    """The worker died, stalled past its budget, printed too much or broke the protocol."""

    def __init__(self, message: str, overrun: str | None = None):
        super().__init__(message)
        self.overrun = overrun  # for a worker stopped by its budget: how it overran ('ran past its budget of...')

    @property
    def timed_out(self) -> bool:
        return self.overrun is not None


class RequestFailed(Exception):
    """The worker is alive but answered a request with a failure (a missing name, bad data...)."""


def sandbox_uid() -> int:
    """A uid no other sandbox of this machine holds now: from this process's id and a counter
    (64 sandboxes at once per grading process; a sandbox's processes all die with it)."""
    return FIRST_UID + (os.getpid() % (1 << 22)) * 64 + next(_sandbox_numbers) % 64


# ---- which sandbox: one choice for `mpcourse grade`, the Gradescope harness and setup.sh --check ----

@dataclass(frozen=True)
class Isolation:
    """The sandbox a grader on this machine runs submissions in: `kind` is BUBBLEWRAP, USER or
    NONE (neither works: `problem` says why); `gaps` is what it does not isolate."""
    kind: str
    problem: str | None = None
    gaps: tuple[str, ...] = ()
    network: bool = False  # USER only: the worker still reaches the network (`unshare` was refused)

    @property
    def usable(self) -> bool:
        return self.kind != NONE

    @property
    def walls(self) -> int:
        """The Landlock ABI the fallback walls itself in with (0: none)."""
        return landlock.abi() if self.kind == USER else 0

    def summary(self) -> str:
        """One line for the terminal and the build log: which sandbox, why not a better one, what it leaves open."""
        if self.kind == BUBBLEWRAP:
            name = "bubblewrap (namespaces, seccomp, a uid and control group per submission when root)"
        elif self.kind == USER:
            walls = f", Landlock ABI {self.walls}" if self.walls else ", no Landlock"
            name = f"an unprivileged user per submission{walls} (fallback: {self.problem})"
        else:
            return f"no sandbox: {self.problem}"
        return f"sandbox: {name}; it does not isolate: {'; '.join(self.gaps)}"


BUBBLEWRAP_GAPS = ("the CPU cores and memory bandwidth (each sandbox gets one CPU weight)",
                   "the kernel (a kernel bug breaks any sandbox)")


def _user_gaps(network: bool, cgroup: bool, walls: int) -> tuple[str, ...]:
    gaps = ["the machine's process list and command lines (visible in /proc, not signalable)",
            "System V semaphores"]
    if walls < 1:
        gaps.append("every file readable by all users (no Landlock: keep solutions, sources and results "
                    "private to root, mode 0700)")
    if walls < 6:
        gaps.append("abstract Unix sockets")
    if network and walls >= 4:
        gaps.append("UDP and other non-TCP network traffic (`unshare --net` was refused; Landlock blocks TCP)")
    elif network:
        gaps.append("the network (`unshare --net` was refused, and no Landlock ABI 4 to block TCP)")
    if not cgroup:
        gaps.append("memory kept by the kernel (no writable control group: address-space limits only) and "
                    "a CPU weight per submission")
    return tuple(gaps) + BUBBLEWRAP_GAPS[1:]


@functools.lru_cache(maxsize=None)
def sandbox_problem() -> str | None:
    """Why no bubblewrap sandbox can be made here (None when one can)."""
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


UNSHARE = ["unshare", "--net", "--ipc"]  # what the fallback asks the kernel for, if it allows


@functools.lru_cache(maxsize=None)
def _unshare_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(UNSHARE + ["/bin/true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=None)
def fallback_problem() -> str | None:
    """Why the unprivileged-user sandbox cannot be used here (None when it can): it needs Linux,
    root (to give each submission a uid) and a kernel that loads the seccomp filter."""
    if sys.platform != "linux":
        return f"the fallback sandbox needs Linux; this is {sys.platform}"
    if os.geteuid() != 0:
        return "the fallback sandbox needs root, to run each submission as a uid of its own"
    probe = ("import importlib.util, os, sys\n"
             f"spec = importlib.util.spec_from_file_location('seccomp', {str(Path(seccomp.__file__))!r})\n"
             "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
             "module.install()\nos.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n"
             "try:\n    os.memfd_create('probe')\nexcept PermissionError:\n    sys.exit(0)\nsys.exit(4)")
    try:
        done = subprocess.run([sys.executable, "-I", "-c", probe, str(sandbox_uid())], capture_output=True,
                              text=True, timeout=60, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the fallback sandbox's probe could not start: {error}"
    if done.returncode != 0:
        return f"the kernel refused the fallback's seccomp filter or uid: {done.stderr.strip()[-300:]}"
    return None


@functools.lru_cache(maxsize=None)
def choose_isolation() -> Isolation:
    """The best sandbox this machine allows: bubblewrap, else an unprivileged user per
    submission (as root), else none (`problem` says why, with how to get one)."""
    problem = sandbox_problem()
    if problem is None:
        return Isolation(BUBBLEWRAP, None, BUBBLEWRAP_GAPS)
    if fallback_problem() is None:
        probe = Cgroup.create(Limits().resident, Limits().processes)
        if probe is not None:
            probe.remove()
        network = not _unshare_allowed()
        return Isolation(USER, problem, _user_gaps(network, probe is not None, landlock.abi()), network)
    return Isolation(NONE, f"{problem}; and {fallback_problem()}. {INSTALL_HINT}")


def unreachable_by_others(path: Path) -> bool:
    """Whether a user other than the owner (a sandbox's uid) can neither list nor read `path`:
    some folder on the way denies others, or the path itself does."""
    path = Path(path).resolve()
    for folder in [*reversed(path.parents), path]:
        try:
            mode = folder.stat().st_mode
        except OSError:
            return True
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return True
    return not path.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH)


SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")


def _python_folders() -> list[str]:
    """What the worker must read besides the system: Python, the virtual environment, `mpcourse`."""
    import mpcourse
    needed = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
              str(Path(mpcourse.__file__).resolve().parent)}
    return sorted(path for path in needed if not path.startswith("/usr/"))


def _walls(workdir: str) -> dict:
    """The fallback worker's Landlock rules (`landlock.restrict`)."""
    return {"read": [*SYSTEM_FOLDERS, "/etc", "/proc", "/sys", *_python_folders()],
            "write": [workdir, "/dev"]}


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
    needed = _python_folders()
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


def _process_table() -> list[tuple[int, int, int, float]]:
    """(pid, parent pid, real uid, CPU seconds of it and its waited-for children) of every process."""
    ticks, table = os.sysconf("SC_CLK_TCK"), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry.name}/status", "rb") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith(b"Uid:"))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
        table.append((int(entry.name), int(fields[1]), uid, sum(int(x) for x in fields[11:15]) / ticks))
    return table


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


def _kill_uid(uid: int):
    """Kill every process of `uid`, detached ones included: a shell of that uid sends SIGKILL to
    all processes it may signal (those of its uid), until none is left."""
    for _ in range(50):
        if not _tasks_of(uid):
            return
        subprocess.run(["/bin/sh", "-c", "kill -9 -1"], user=uid, group=uid, extra_groups=[], cwd="/",
                       capture_output=True)
        time.sleep(0.02)


def _remove_files_of(uid: int, folders=("/tmp", "/var/tmp", "/dev/shm")):
    """What a fallback sandbox left in the machine's shared scratch folders."""
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


class Sandbox:
    """One worker process and its pipes. `request` sends a JSON request and returns the reply.

    `sandboxed`: in the sandbox `choose_isolation` picks (or `kind`, to ask for one); without it
    (--unsafe-no-sandbox) in a temporary folder, as the grader's user. `deadline`: the `Budget`
    of its start (a bare `time.monotonic()` deadline is taken as wall clock only)."""

    closed_cpu_seconds = 0.0  # CPU time of every sandbox this process has closed: a submission's cost

    def __init__(self, limits: Limits, deadline: Budget | float, sandboxed: bool = True, trusted: bool = False,
                 kind: str | None = None):
        self.limits, self.printed, self.flooded, self.tail = limits, 0, False, b""
        self.kind = (kind or choose_isolation().kind) if sandboxed else NONE
        if sandboxed and self.kind not in (BUBBLEWRAP, USER):
            raise RuntimeError(f"no sandbox can be made here: {choose_isolation().problem}")
        if self.kind == USER and os.geteuid() != 0:
            raise RuntimeError("the unprivileged-user sandbox needs a grader running as root")
        config = {"memory": limits.memory, "cpu": limits.cpu, "file_size": limits.file_size,
                  "open_files": limits.open_files}
        command, passed, self.cgroup, self.uid, self.workdir = [sys.executable, "-I", str(WORKER)], [], None, None, None
        if sandboxed and os.geteuid() == 0:
            self.uid = sandbox_uid()
            config.update(user=self.uid, processes=limits.processes)
            self.cgroup = Cgroup.create(limits.resident, limits.processes)
        elif sandboxed:  # the limit counts all this user's processes and threads, the grader's included
            config.update(processes=_tasks_of(os.geteuid()) + limits.processes)
        if self.kind == BUBBLEWRAP:  # its home and /tmp are small memory file systems that vanish with it
            passed = [seccomp.filter_fd()]
            command = _bwrap(limits, passed[0]) + command
            env, cwd = {"PATH": "/usr/bin:/bin"}, "/"
        elif self.kind == USER:  # a private folder of its own uid; the worker loads the seccomp filter itself
            self.workdir = cwd = tempfile.mkdtemp(prefix="mpcourse-sandbox-")
            os.chown(cwd, self.uid, self.uid)
            config.update(seccomp=True)
            if landlock.abi():
                config.update(landlock=_walls(cwd))
            command = (UNSHARE if _unshare_allowed() else []) + command
            env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "IPYTHONDIR": os.path.join(cwd, ".ipython"),
                   "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", **kernel_environment()}
        else:
            self.workdir = cwd = tempfile.mkdtemp(prefix="mpcourse-grade-")
            home = {"HOME": cwd, "IPYTHONDIR": os.path.join(cwd, ".ipython"), "MPLBACKEND": "Agg"}
            env = dict(os.environ, **home) if trusted else dict(home, PATH="/usr/bin:/bin", **kernel_environment())
        if self.cgroup is not None:
            command = self.cgroup.wrap(command)
        try:
            self.process = subprocess.Popen(command + [json.dumps(config)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                                            start_new_session=True, pass_fds=passed)
        except BaseException:
            self._release()
            raise
        finally:
            for fd in passed:
                os.close(fd)
        self._buffer, self._requests, self._cpu, self._cpu_read = bytearray(), 0, 0.0, 0.0
        self._drain = threading.Thread(target=self._count_output, daemon=True)
        self._drain.start()
        try:
            self._receive(as_budget(deadline))  # {"ready": true} once torch is loaded and the limits are set
        except WorkerGone:
            self.close()
            raise

    def cpu_seconds(self) -> float:
        """CPU time the sandbox has used so far, all its processes together: its control group's
        count, else the sum over its processes (those of its uid, or the worker's descendants),
        read at most every `POLL` seconds."""
        if time.monotonic() - self._cpu_read < POLL:
            return self._cpu
        used = self.cgroup.cpu_seconds() if self.cgroup is not None else None
        if used is None:
            table = _process_table()
            if self.uid is not None:
                used = sum(cpu for _, _, uid, cpu in table if uid == self.uid)
            else:
                children, mine, used = {}, [self.process.pid], 0.0
                for pid, parent, _, cpu in table:
                    children.setdefault(parent, []).append((pid, cpu))
                while mine:
                    for pid, cpu in children.get(mine.pop(), ()):
                        used += cpu
                        mine.append(pid)
        self._cpu, self._cpu_read = max(self._cpu, used), time.monotonic()
        return self._cpu

    def _count_output(self):
        """Read and drop the learner's output, counting it; too much stops the worker."""
        for chunk in iter(lambda: self.process.stderr.read1(1 << 16), b""):
            self.printed += len(chunk)
            self.tail = (self.tail + chunk)[-2000:]
            if self.printed > self.limits.output and not self.flooded:
                self.flooded = True
                self.kill()

    def request(self, message: dict, deadline: Budget | float) -> dict:
        """Send `message`; its reply, within `deadline` (a `Budget`, or a bare monotonic deadline)."""
        budget = as_budget(deadline)
        self._requests += 1
        data = (json.dumps(dict(message, id=self._requests)) + "\n").encode()
        try:
            self._send(data, budget)
        except (BrokenPipeError, OSError):
            raise self._gone("stopped reading requests") from None
        reply = self._receive(budget, self._requests)
        if "failed" in reply:
            raise RequestFailed(f"the submission's process could not serve {message.get('op')!r}: "
                                f"{str(reply['failed'])[:200]}")
        return reply

    def _check(self, budget: Budget):
        if why := budget.overrun(self):
            raise self._gone(f"timed out: it {why}", overrun=why)

    def _send(self, data: bytes, budget: Budget):
        fd = self.process.stdin.fileno()
        view = memoryview(data)
        while view:
            self._check(budget)
            if select.select([], [fd], [], budget.wait())[1]:
                view = view[os.write(fd, view[: 1 << 16]):]

    def _receive(self, budget: Budget, number: int = 0) -> dict:
        """The next reply that answers request `number`. A line is parsed only if it is under
        `limits.reply` bytes and ends with that number; others (a submission can write on this
        pipe too) are dropped unread, and an over-long line stops the worker."""
        fd = self.process.stdout.fileno()
        while True:
            end = self._buffer.find(b"\n")
            while end < 0:
                if len(self._buffer) > self.limits.reply:
                    raise self._gone(f"sent a reply line over {self.limits.reply >> 20} MiB")
                self._check(budget)
                if not select.select([fd], [], [], budget.wait())[0]:
                    continue
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

    def _gone(self, what: str, overrun: str | None = None) -> WorkerGone:
        self.kill()
        self.process.wait()
        if self.flooded:
            what, overrun = f"printed more than {self.limits.output >> 20} MiB", None
        elif what == "died" and self.process.returncode and self.process.returncode < 0:
            what = f"was killed by {signal.Signals(-self.process.returncode).name} (a crash or a limit)"
        elif what == "died":
            what = "died (os._exit, a crash or a limit)"
        if os.environ.get("MPCOURSE_GRADE_DEBUG"):
            print(f"[worker {what}, exit {self.process.returncode}] {self.tail.decode(errors='replace')}", file=sys.stderr)
        return WorkerGone(f"the submission's process {what}", overrun)

    def kill(self):
        """Stop the worker and everything it started: with bubblewrap its whole PID namespace;
        with a control group every process in it; with a uid of its own every process of that uid."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.cgroup is not None:
            self.cgroup.kill_all()

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
        self._cpu_read = -math.inf  # its final count, before the control group goes
        Sandbox.closed_cpu_seconds += self.cpu_seconds()
        self._release()

    def _release(self):
        """What the sandbox held outside its processes: its control group, the processes and
        scratch files of its uid (fallback), its work folder."""
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.kind == USER and self.uid is not None:
            _kill_uid(self.uid)
            _remove_files_of(self.uid)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
