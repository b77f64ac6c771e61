"""Landlock: the fallback sandbox's walls, drawn by the worker around itself with no privilege.

Where namespaces are refused (Docker's default seccomp profile), bubblewrap cannot hide the
machine's files from a submission. Landlock (Linux 5.13 and later, `landlock_create_ruleset`)
lets a process give up, for itself and all it starts, every filesystem access except those a
ruleset grants, beneath chosen folders. The worker calls `restrict` before any learner code runs:
- read and execute beneath the system folders, the Python installation, the virtual environment
  and the `mpcourse` package (no `solutions/`, no submissions, no gradebook, no /autograder);
- read and write beneath its private work folder, /dev (null, urandom...) and /dev/shm;
- on ABI 4 and later, no TCP connect or bind at all (no network, even where `unshare --net`
  was refused); on ABI 6 and later, no abstract Unix socket and no signal outside the sandbox.

`abi()` says what the kernel offers (0: no Landlock, or refused by a seccomp profile).
"""
from __future__ import annotations

import ctypes
import os

CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and AArch64
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
WRITE_DIR = sum(1 << bit for bit in range(4, 13))  # remove and make files, folders, sockets, fifos, links
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


def _filesystem_rights(abi: int) -> int:
    """Every filesystem right the kernel's ABI knows: all of them are handled (denied unless granted)."""
    rights = EXECUTE | WRITE_FILE | READ_FILE | READ_DIR | WRITE_DIR
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none (or a seccomp profile refuses it)."""
    version = _libc().syscall(CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    return max(version, 0)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict(readable: list[str], writable: list[str]) -> int:
    """Confine this process and all it starts to read `readable` and read and write `writable`
    (folders, beneath them); return the ABI used. Raises OSError where Landlock is missing."""
    libc, version = _libc(), abi()
    if version < 1:
        raise OSError("Landlock is not available in this kernel (or a seccomp profile refuses it)")
    handled = _filesystem_rights(version)
    fields = [handled]
    if version >= 4:
        fields.append(NET_BIND_TCP | NET_CONNECT_TCP)
    if version >= 6:
        fields.append(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = libc.syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        read = EXECUTE | READ_FILE | READ_DIR
        for paths, access in ((readable, read), (writable, handled)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # absent here (lib32...): nothing to grant
                try:
                    allowed = access if os.path.isdir(path) else access & (EXECUTE | READ_FILE | WRITE_FILE |
                                                                           TRUNCATE | IOCTL_DEV)
                    rule = _PathBeneath(allowed & handled, fd)
                    if libc.syscall(ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
                finally:
                    os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return version
