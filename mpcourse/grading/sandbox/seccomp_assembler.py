"""The course's own classic-BPF assembler for the seccomp policy: the fallback where libseccomp
cannot be loaded (`seccomp.build` chooses).

It knows the system call numbers of the two machines the course supports, x86-64 and AArch64,
written here by hand from the kernel's tables (tests/test_seccomp_builders.py checks each against
libseccomp's). Its program: check the architecture (another, x32 calls on x86-64 included, kills
the process), then compare the call's number with each refused call's; `clone` goes on to test
its flags (the low 32 bits of its first argument, all the kernel reads).
"""
from __future__ import annotations

import struct
from collections.abc import Mapping

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
NR, ARCH, ARG0_LOW = 0, 4, 16
LOAD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K, BPF_RET|K
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
X32_BIT = 0x40000000

#: Per machine: the audit architecture, then the number of each call the policy names.
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


def _errno(number: int) -> int:
    return 0x00050000 | number  # SECCOMP_RET_ERRNO


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


def assemble(machine: str, refused: Mapping[str, int], clone_flags: int, clone_errno: int) -> bytes:
    """The filter for `machine`: each call of `refused` fails with its errno, `clone` with any of
    `clone_flags` set fails with `clone_errno`, everything else is allowed. A machine or a call
    this table has no number for is refused by name."""
    if machine not in SYSCALLS:
        raise ValueError(f"the course's BPF assembler has no system call numbers for machine {machine!r}; "
                         f"it knows: {', '.join(sorted(SYSCALLS))}")
    arch, numbers = SYSCALLS[machine]
    unknown = sorted(set(refused) - set(numbers))
    if unknown:
        raise ValueError(f"the course's BPF assembler has no number for the system call(s) "
                         f"{', '.join(unknown)} on {machine}; add it to seccomp_assembler.SYSCALLS")
    p = Program()
    p.op(LOAD, ARCH)
    p.op(JEQ, arch, false="kill")
    p.op(LOAD, NR)
    if machine == "x86_64":
        p.op(JGE, X32_BIT, true="kill")
    p.op(JEQ, numbers["clone"], true="clone")
    for name, error in refused.items():
        p.op(JEQ, numbers[name], true=f"errno {error}")
    p.op(RET, ALLOW)
    p.label("clone")
    p.op(LOAD, ARG0_LOW)
    p.op(JSET, clone_flags, true=f"errno {clone_errno}")
    p.op(RET, ALLOW)
    for error in sorted(set(refused.values()) | {clone_errno}):
        p.label(f"errno {error}")
        p.op(RET, _errno(error))
    p.label("kill")
    p.op(RET, KILL_PROCESS)
    return p.assemble()
