"""A seccomp filter for the sandbox: system calls whose effects outlive or escape its limits fail.

The policy (`REFUSED`, `CLONE_FLAGS`) is the one place those calls are named. `build` turns it
into the classic BPF program the kernel runs: with libseccomp (through `pyseccomp`), which knows
each call's number on each machine, else, where libseccomp cannot be loaded or does not know a
call, with the course's own assembler (`seccomp_assembler`); `Filter.builder` says which, for
the sandbox's summary (`isolation.Isolation.summary`). Bubblewrap loads the program from a file
descriptor (`bwrap --seccomp FD`, `filter_fd`) into the sandboxed process before it runs anything;
the fallback sandbox (no namespaces) has the worker load the grader's program itself (`install`)
before any learner code runs. The calls it refuses, with EPERM, are the ones a learner could use
to hold memory or state that the sandbox's limits do not see:

- `memfd_create`, `memfd_secret`: anonymous files whose pages count toward no address-space
  limit (a memfd hoard held 1.5 GiB under a 1 GiB RLIMIT_AS);
- `keyctl`, `add_key`, `request_key`: the kernel keyring belongs to a uid and outlives every
  process, so a later sandbox of the same uid could read what an earlier one left;
- `shmget`, `msgget`: System V shared memory and queues, held by the kernel until removed;
- `userfaultfd`, `perf_event_open`, `bpf`, `io_uring_*`, `ptrace`, `process_vm_*`: kernel
  interfaces no exercise needs and that widen what a submission can reach;
- `unshare`, `setns`, `mount` and friends, and `clone` with a namespace flag: a new user
  namespace would hand the learner capabilities (to mount a tmpfs no limit bounds, for one).

`clone3` answers ENOSYS, since its flags sit in memory a filter cannot read; the C library then
falls back to `clone`, whose flags are checked. A process of another architecture (x32 calls on
x86-64 included) is killed. Everything else is allowed.

Machines: x86-64 and AArch64 (`MACHINES`), the two the course runs on; elsewhere `build` refuses
by name. The worker loads this file by path, without the `mpcourse` package: only `install` runs
there, and the builders import what they need when called.
"""
from __future__ import annotations

import errno
import functools
import os
import platform
import tempfile
from typing import NamedTuple

#: The policy: each call refused outright, and the errno it fails with.
REFUSED = {**dict.fromkeys((
    "memfd_create", "memfd_secret", "keyctl", "add_key", "request_key", "shmget", "msgget",
    "userfaultfd", "perf_event_open", "bpf", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns", "mount", "umount2",
    "pivot_root", "open_tree", "move_mount", "fsopen", "fsmount"), errno.EPERM),
    "clone3": errno.ENOSYS}
#: The policy for `clone`: with any of these flags (a new namespace) it fails with CLONE_ERRNO.
CLONE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
               "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
               "CLONE_NEWNET": 0x40000000}
CLONE_ERRNO = errno.EPERM
#: The machines the filter is built for (platform.machine()), with libseccomp's name for each.
MACHINES = {"x86_64": "X86_64", "aarch64": "AARCH64"}
ASSEMBLER = "the course's own BPF assembler"


class Filter(NamedTuple):
    """A filter program, as the kernel and `bwrap --seccomp` read it, and what built it:
    'libseccomp X.Y.Z', or ASSEMBLER with why libseccomp did not."""
    program: bytes
    builder: str


def build(machine: str | None = None) -> Filter:
    """The policy's filter for `machine` (default: this one), from libseccomp where it can be
    loaded and knows every call, else from the course's own assembler."""
    machine = machine or platform.machine()
    if machine not in MACHINES:
        raise ValueError(f"no seccomp filter for machine {machine!r}; known: {', '.join(sorted(MACHINES))}")
    library, version = libseccomp()
    if library is None:
        why = version
    else:
        try:
            return Filter(libseccomp_program(library, version, machine), f"libseccomp {version}")
        except ValueError as error:  # an older libseccomp than a call of the policy
            why = str(error)
    from mpcourse.grading.sandbox.seccomp_assembler import assemble
    return Filter(assemble(machine, REFUSED, sum(CLONE_FLAGS.values()), CLONE_ERRNO), f"{ASSEMBLER} ({why})")


def filter_program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one), as the bytes `bwrap --seccomp` reads."""
    return build(machine).program


@functools.lru_cache(maxsize=None)
def libseccomp():
    """(pyseccomp, libseccomp's version, e.g. '2.5.4'), or (None, why neither can be loaded)."""
    import ctypes.util
    try:
        import pyseccomp  # raises RuntimeError where it finds no libseccomp

        class Version(ctypes.Structure):
            _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

        library = ctypes.CDLL(ctypes.util.find_library("seccomp"))  # the library pyseccomp found
        library.seccomp_version.restype = ctypes.POINTER(Version)
        version = library.seccomp_version().contents
    except (ImportError, RuntimeError, OSError, AttributeError) as error:
        return None, f"libseccomp cannot be loaded: {type(error).__name__}: {error}"
    return pyseccomp, f"{version.major}.{version.minor}.{version.micro}"


def libseccomp_program(library, version: str, machine: str) -> bytes:
    """The policy's filter for `machine`, built by libseccomp `version` through `library` (pyseccomp,
    whose interface is libseccomp's own Python binding's). A call libseccomp does not know on that
    machine is refused by name."""
    arch = getattr(library.Arch, MACHINES[machine])
    unknown = [name for name in (*REFUSED, "clone") if library.resolve_syscall(arch, name) < 0]
    if unknown:
        raise ValueError(f"libseccomp {version} does not know the system call(s) {', '.join(unknown)} "
                         f"on {machine}")
    rules = library.SyscallFilter(library.ALLOW)
    rules.set_attr(library.Attr.ACT_BADARCH, library.KILL_PROCESS)
    if library.system_arch() != arch:  # another machine's filter (the tests build both)
        rules.add_arch(arch)
        rules.remove_arch(library.system_arch())
    for name, error in REFUSED.items():
        rules.add_rule(library.ERRNO(error), name)
    for flag in CLONE_FLAGS.values():  # rules for one call are or-ed: any flag refuses
        rules.add_rule(library.ERRNO(CLONE_ERRNO), "clone", library.Arg(0, library.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_fd() -> int:
    """A readable descriptor holding this machine's filter (a pipe, so no file is left behind);
    the caller passes it to bwrap and closes it."""
    program = filter_program()
    read, write = os.pipe()
    try:
        os.write(write, program)  # a few hundred bytes: far below a pipe's buffer
    finally:
        os.close(write)
    return read


#: The number of `seccomp` itself on each machine (tests/test_seccomp_builders.py checks them
#: against libseccomp's), for `install`, which runs where libseccomp is not loaded.
SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
PR_SET_NO_NEW_PRIVS, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 38, 1, 1


def install(program: bytes):
    """Load `program` (`build`'s) into this process, every thread of it (TSYNC), and all it starts:
    the fallback sandbox's way, where no bubblewrap loads it. Raises OSError if the kernel refuses."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.syscall(SECCOMP_SYSCALL[platform.machine()], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                    ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
