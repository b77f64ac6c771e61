"""Which sandbox this machine allows, and how each is walled: one choice for `mpcourse grade`, the
Gradescope harness and setup.sh --check (`choose_isolation`), and the command lines and rules
that build it (`bwrap_command`, `landlock_rules`). `sandbox.Sandbox` runs a worker inside.

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
"""
from __future__ import annotations

import functools
import itertools
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mpcourse.grading.sandbox import landlock, seccomp
from mpcourse.grading.sandbox.cgroup import Cgroup
from mpcourse.grading.sandbox.limits import Limits, kernel_environment

FIRST_UID = 1_000_000_000  # sandbox uids: far above any real user's, below 2**31
_sandbox_numbers = itertools.count()
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install "
                "bubblewrap`), or grade anyway, unprotected, with --unsafe-no-sandbox")
BUBBLEWRAP, USER, NONE = "bubblewrap", "unprivileged-user", "none"


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
        """One line for the terminal and the build log: which sandbox, why not a better one, what it
        leaves open."""
        if self.kind == BUBBLEWRAP:
            name = (f"bubblewrap (namespaces, a seccomp filter by {seccomp.build().builder}, a uid and "
                    "control group per submission when root)")
        elif self.kind == USER:
            walls = f", Landlock ABI {self.walls}" if self.walls else ", no Landlock"
            name = (f"an unprivileged user per submission{walls}, a seccomp filter by "
                    f"{seccomp.build().builder} (fallback: {self.problem})")
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
        gaps.append("UDP and other non-TCP network traffic (`unshare --net` was refused; Landlock blocks "
                    "TCP)")
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
        done = subprocess.run(bwrap_command(Limits(), program) + [sys.executable, "-I", "-c",
                                                                  "pass"], capture_output=True,
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
def unshare_allowed() -> bool:
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
             "module.install(bytes.fromhex(sys.argv[2]))\n"
             "os.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n"
             "try:\n    os.memfd_create('probe')\nexcept PermissionError:\n    sys.exit(0)\nsys.exit(4)")
    try:
        program = seccomp.filter_program().hex()
    except ValueError as error:
        return str(error)
    try:
        done = subprocess.run([sys.executable, "-I", "-c", probe, str(sandbox_uid()), program],
                              capture_output=True, text=True, timeout=60, cwd="/")
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
        network = not unshare_allowed()
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


def landlock_rules(workdir: str) -> dict:
    """The fallback worker's Landlock rules (`landlock.restrict`)."""
    return {"read": [*SYSTEM_FOLDERS, "/etc", "/proc", "/sys", *_python_folders()],
            "write": [workdir, "/dev"]}


def bwrap_command(limits: Limits, seccomp_fd: int) -> list[str]:
    """The bubblewrap command line around a process that may write only its own small home, /tmp
    and /dev/shm, under the seccomp filter read from `seccomp_fd`."""
    root = os.geteuid() == 0
    args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--seccomp", str(seccomp_fd), "--proc", "/proc",
            "--dev", "/dev",
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
    return args + ["--perms", "0755", "--dir", "/home", "--size", str(limits.home),
                   "--perms", "1777", "--tmpfs",
                   "/home/learner", "--chdir", "/home/learner", "--clearenv",
                   "--setenv", "HOME", "/home/learner", "--setenv", "PATH", "/usr/bin:/bin",
                   "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "MPLBACKEND", "Agg",
                   *[arg for name,
                     value in kernel_environment().items() for arg in ("--setenv", name, value)],
                   "--"]
