"""A control group per sandbox: its own memory, process and CPU share, where the machine lets us make one.

RLIMIT_AS bounds a process's address space, RLIMIT_NPROC counts every process of a uid and
RLIMIT_CPU each process's own CPU time; a control group instead counts what the sandbox holds,
all its processes together, however they were started (threads, forks, `setsid`):
- memory the kernel keeps for it (pipe buffers, socket buffers, tmpfs pages) and every thread
  (`memory.max`, `pids.max`);
- **one CPU weight** (`cpu.shares` in v1, `cpu.weight` in v2): 32 spinners in one sandbox share
  what one classmate's sandbox gets, instead of 32 times as much;
- its CPU time, all processes together (`cpuacct.usage` in v1, `cpu.stat`'s usage_usec in v2):
  the time budgets of `limits.Budget` are this, so a busy machine slows a submission without
  running its budget down.

The grader makes the group under its own, in cgroup v2 or v1 (one folder per hierarchy:
`memory`, `pids`, `cpu`, `cpuacct`, co-mounted ones once), puts the sandbox in it before the
sandbox starts (`wrap`) and removes it afterwards. Where none can be made (not root, or a
read-only /sys/fs/cgroup) `create` returns None and the sandbox keeps only its rlimits, and its
CPU time is read from its processes (`sandbox.ProcessClock`): INSTRUCTORS.md says what that leaves open.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CPU_WEIGHT_V1 = 1024  # cpu.shares of each sandbox: what one ordinary process of the machine weighs
CPU_WEIGHT_V2 = 100   # cpu.weight, likewise
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
_numbers = itertools.count()


def _own_groups() -> dict[str, str]:
    """This process's group per v1 controller (and '' for v2), from /proc/self/cgroup."""
    groups = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return groups
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path.lstrip("/")
    return groups


def _v1_parents() -> dict[str, Path]:
    """The grader's own folder in each v1 hierarchy we use (co-mounted hierarchies share one)."""
    groups = _own_groups()
    return {c: ROOT / c / groups[c] for c in V1_CONTROLLERS
            if c in groups and (ROOT / c / groups[c]).is_dir()}


class Cgroup:
    """One sandbox's group(s): `folders` hold the cgroup.procs files the sandbox joins."""

    def __init__(self, folders: list[Path]):
        self.folders = folders

    @classmethod
    def create(cls, memory: int, processes: int) -> Cgroup | None:
        """A new group limited to `memory` bytes and `processes` tasks, with a CPU weight of its
        own where the `cpu` controller is there, or None if none can be made."""
        if os.geteuid() != 0:
            return None
        name = f"mpcourse-{os.getpid()}-{next(_numbers)}"
        parents = _v1_parents()
        made = []
        try:
            if "memory" in parents and "pids" in parents:
                limits = {"memory": {"memory.limit_in_bytes": memory}, "pids": {"pids.max": processes},
                          "cpu": {"cpu.shares": CPU_WEIGHT_V1}, "cpuacct": {}}
                seen = {}
                for controller, parent in parents.items():
                    folder = parent / name
                    if folder.resolve() in seen:  # cpu and cpuacct co-mounted: one folder for both
                        continue
                    folder.mkdir()
                    seen[folder.resolve()] = folder
                    made.append(folder)
                for controller, parent in parents.items():
                    for limit, value in limits[controller].items():
                        (parent / name / limit).write_text(str(value))
            else:
                parent = ROOT / _own_groups().get("", "")
                try:  # the cpu controller, for a weight per group; where it is not delegated, none
                    (parent / "cgroup.subtree_control").write_text("+cpu")
                except OSError:
                    pass
                folder = parent / name
                folder.mkdir()
                made.append(folder)
                (folder / "memory.max").write_text(str(memory))
                (folder / "pids.max").write_text(str(processes))
                (folder / "memory.swap.max").write_text("0")
                if (folder / "cpu.weight").exists():
                    (folder / "cpu.weight").write_text(str(CPU_WEIGHT_V2))
        except OSError:
            cls(made).remove()
            return None
        return cls(made)

    def wrap(self, command: list[str]) -> list[str]:
        """`command`, started by a shell that first moves itself into the group(s), so that
        everything the command starts is counted from its first instruction."""
        join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", join, "sh", *[str(f / "cgroup.procs") for f in self.folders], "--", *command]

    @property
    def has_cpu_share(self) -> bool:
        """Whether the group has a CPU weight of its own (the `cpu` controller is there)."""
        return any((f / "cpu.shares").exists() or (f / "cpu.weight").exists() for f in self.folders)

    def cpu_seconds(self) -> float | None:
        """CPU time used by every process the group ever held, in seconds (None if the kernel does not
        say)."""
        for folder in self.folders:
            try:
                return int((folder / "cpuacct.usage").read_text()) / 1e9
            except (OSError, ValueError):
                pass
            try:
                for line in (folder / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
            except (OSError, ValueError):
                pass
        return None

    def kill_all(self):
        """Kill every process in the group (and what they start meanwhile)."""
        for folder in self.folders:
            _kill_all(folder)

    def remove(self):
        """Kill whatever is left in the group, then delete it (a group with tasks cannot go)."""
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    _kill_all(folder)
                    time.sleep(0.02)


def sweep():
    """Remove the groups of grading processes that died without removing theirs (killed past
    their time): a group is named after the process that made it."""
    parents = set(_v1_parents().values()) | {ROOT / _own_groups().get("", "")}
    for parent in parents:
        for folder in parent.glob("mpcourse-*-*") if parent.is_dir() else ():
            pid = folder.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                Cgroup([folder]).remove()


def _kill_all(folder: Path):
    try:
        pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
