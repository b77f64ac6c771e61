"""A seccomp filter for the sandbox: system calls whose effects outlive or escape its limits fail.

Bubblewrap loads a classic BPF program from a file descriptor (`bwrap --seccomp FD`) into the
sandboxed process before it runs anything; the fallback sandbox (no namespaces) has the worker
load it itself (`install`) before any learner code runs. This module assembles that program by
hand (no libseccomp needed) for x86-64 and AArch64. The calls it refuses, with EPERM, are the ones a
learner could use to hold memory or state that the sandbox's limits do not see:

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
"""
from __future__ import annotations

import errno
import os
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
NR, ARCH, ARG0_LOW = 0, 4, 16
LOAD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K, BPF_RET|K
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
X32_BIT = 0x40000000
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET


def _errno(number: int) -> int:
    return 0x00050000 | number  # SECCOMP_RET_ERRNO


#: Per machine: the audit architecture, then the number of each refused call.
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "memfd_create": 319, "memfd_secret": 447, "keyctl": 250, "add_key": 248, "request_key": 249,
        "shmget": 29, "msgget": 68, "userfaultfd": 323, "perf_event_open": 298, "bpf": 321,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165,
        "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsmount": 432, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {
        "memfd_create": 279, "memfd_secret": 447, "keyctl": 219, "add_key": 217, "request_key": 218,
        "shmget": 194, "msgget": 186, "userfaultfd": 282, "perf_event_open": 241, "bpf": 280,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97, "setns": 268, "mount": 40,
        "umount2": 39, "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsmount": 432, "clone": 220, "clone3": 435}),
}
SYSCALLS["arm64"] = SYSCALLS["aarch64"]


class Program:
    """Classic BPF with forward jumps to named labels, resolved when assembled."""

    def __init__(self):
        self.code, self.labels = [], {}

    def op(self, code: int, k: int = 0, true: str | None = None, false: str | None = None):
        self.code.append((code, true, false, k))

    def label(self, name: str):
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = b""
        for index, (code, true, false, k) in enumerate(self.code):
            jumps = [0 if to is None else self.labels[to] - index - 1 for to in (true, false)]
            if not all(0 <= jump <= 255 for jump in jumps):
                raise ValueError(f"jump out of range at instruction {index}: {jumps}")
            out += struct.pack("=HBBI", code, jumps[0], jumps[1], k)
        return out


def filter_program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one), as the bytes `bwrap --seccomp` reads."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        raise ValueError(f"no seccomp filter for machine {machine!r}; known: {', '.join(sorted(SYSCALLS))}")
    arch, numbers = SYSCALLS[machine]
    p = Program()
    p.op(LOAD, ARCH)
    p.op(JEQ, arch, false="kill")
    p.op(LOAD, NR)
    if arch == SYSCALLS["x86_64"][0]:
        p.op(JGE, X32_BIT, true="kill")
    p.op(JEQ, numbers["clone"], true="clone")
    p.op(JEQ, numbers["clone3"], true="nosys")
    for name, number in numbers.items():
        if name not in ("clone", "clone3"):
            p.op(JEQ, number, true="refuse")
    p.op(RET, ALLOW)
    p.label("clone")
    p.op(LOAD, ARG0_LOW)
    p.op(JSET, NAMESPACE_FLAGS, true="refuse")
    p.op(RET, ALLOW)
    p.label("refuse")
    p.op(RET, _errno(errno.EPERM))
    p.label("nosys")
    p.op(RET, _errno(errno.ENOSYS))
    p.label("kill")
    p.op(RET, KILL_PROCESS)
    return p.assemble()


def filter_fd() -> int:
    """A readable descriptor holding the filter (a pipe, so no file is left behind); the caller
    passes it to bwrap and closes it."""
    program = filter_program()
    read, write = os.pipe()
    try:
        os.write(write, program)  # a few hundred bytes: far below a pipe's buffer
    finally:
        os.close(write)
    return read


SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277, "arm64": 277}
PR_SET_NO_NEW_PRIVS, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 38, 1, 1


def install():
    """Load the filter into this process, every thread of it (TSYNC), and all it starts: the
    fallback sandbox's way, where no bubblewrap loads it. Raises OSError if the kernel refuses."""
    import ctypes

    program = filter_program()
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
