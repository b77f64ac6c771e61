"""A control group per sandbox: its own memory and process limits, where the machine lets us make one.

RLIMIT_AS bounds a process's address space, and RLIMIT_NPROC counts every process of a uid; a
control group instead counts what the sandbox holds, all its processes together: memory the
kernel keeps for it (pipe buffers, socket buffers, tmpfs pages) included, and every thread.
The grader makes one under its own group, in cgroup v2 (`memory.max`, `pids.max`) or v1 (the
`memory` and `pids` hierarchies), puts the sandbox in it before bubblewrap starts (`wrap`) and
removes it afterwards. Where none can be made (not root, or a read-only /sys/fs/cgroup) `create`
returns None and the sandbox keeps only its rlimits: INSTRUCTORS.md says what that leaves open.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
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


class Cgroup:
    """One sandbox's group(s): `files` are the cgroup.procs files the sandbox joins."""

    def __init__(self, folders: list[Path]):
        self.folders = folders

    @classmethod
    def create(cls, memory: int, processes: int) -> Cgroup | None:
        """A new group limited to `memory` bytes and `processes` tasks, or None if none can be made."""
        if os.geteuid() != 0:
            return None
        name = f"mpcourse-{os.getpid()}-{next(_numbers)}"
        groups = _own_groups()
        v1 = [("memory", "memory.limit_in_bytes", memory), ("pids", "pids.max", processes)]
        made = []
        try:
            if all((ROOT / c / groups.get(c, "")).is_dir() for c, _, _ in v1) and all(c in groups for c, _, _ in v1):
                for controller, limit, value in v1:
                    folder = ROOT / controller / groups[controller] / name
                    folder.mkdir()
                    made.append(folder)
                    (folder / limit).write_text(str(value))
            else:
                folder = ROOT / groups.get("", "") / name
                folder.mkdir()
                made.append(folder)
                (folder / "memory.max").write_text(str(memory))
                (folder / "pids.max").write_text(str(processes))
                (folder / "memory.swap.max").write_text("0")
        except OSError:
            cls(made).remove()
            return None
        return cls(made)

    def wrap(self, command: list[str]) -> list[str]:
        """`command`, started by a shell that first moves itself into the group(s), so that
        everything the command starts is counted from its first instruction."""
        join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", join, "sh", *[str(f / "cgroup.procs") for f in self.folders], "--", *command]

    def peak_memory(self) -> int | None:
        """The most memory the group held, in bytes (None if the kernel does not say)."""
        for folder in self.folders:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                try:
                    return int((folder / name).read_text())
                except (OSError, ValueError):
                    continue
        return None

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
    groups = _own_groups()
    parents = {ROOT / c / groups[c] for c in ("memory", "pids") if c in groups} | {ROOT / groups.get("", "")}
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
