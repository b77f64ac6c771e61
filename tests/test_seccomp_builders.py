"""The sandbox's seccomp filter, from libseccomp and from the course's own assembler (the fallback).

Both programs run here through a small classic-BPF interpreter, on each call of the policy at the
number libseccomp gives it on each machine: a wrong hand-written number, a call left out or a
wrong errno makes the two disagree. The kernel is the other reference: each builder's program is
loaded into a process of its own (as the fallback sandbox's worker loads it), which then tries a
refused and an allowed call of each kind.
"""
import errno
import json
import os
import platform
import re
import struct
import subprocess
import sys
import textwrap

import pytest

if sys.platform != "linux":
    pytest.skip("seccomp is Linux's, and pyseccomp a Linux-only dependency (pyproject.toml)",
                allow_module_level=True)

import pyseccomp  # noqa: E402  (the lock installs it on Linux)

from grading_budgets import program_backstop  # noqa: E402
from mpcourse.grading.sandbox import seccomp, seccomp_assembler  # noqa: E402
from mpcourse.grading.sandbox.isolation import BUBBLEWRAP, USER, Isolation  # noqa: E402

ALLOW, KILL_PROCESS = pyseccomp.ALLOW, pyseccomp.KILL_PROCESS
MACHINES = {"x86_64": pyseccomp.Arch.X86_64, "aarch64": pyseccomp.Arch.AARCH64}
ALLOWED = ("read", "write", "openat", "mmap", "getpid", "exit_group", "execve", "wait4", "socket")
X32_BIT = 0x40000000
SIGCHLD = 17
# Every opcode the interpreter knows: loads of seccomp_data, jumps with a constant, AND, return.
LD_ABS, JA, JEQ, JGT, JGE, JSET, AND, RET = 0x20, 0x05, 0x15, 0x25, 0x35, 0x45, 0x54, 0x06


def run_bpf(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What `program` answers a call `nr` of audit architecture `arch` with first argument `arg0`
    (the kernel's struct seccomp_data), as the kernel's classic-BPF interpreter computes it."""
    data = struct.pack("=IIQ6Q", nr & 0xFFFFFFFF, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    pc, a = 0, 0
    while True:
        op, true, false, k = code[pc]
        pc += 1
        if op == LD_ABS:
            a = struct.unpack_from("=I", data, k)[0]
        elif op == AND:
            a &= k
        elif op == JA:
            pc += k
        elif op in (JEQ, JGT, JGE, JSET):
            taken = {JEQ: a == k, JGT: a > k, JGE: a >= k, JSET: a & k != 0}[op]
            pc += true if taken else false
        elif op == RET:
            return k
        else:
            raise AssertionError(f"opcode {op:#x} at {pc - 1}: not one a seccomp filter here needs")


def _without_libseccomp(monkeypatch):
    """As on a machine without libseccomp.so.2: pyseccomp's import fails as it fails there."""
    import ctypes.util
    monkeypatch.delitem(sys.modules, "pyseccomp")
    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None if name == "seccomp" else real(name))
    seccomp.libseccomp.cache_clear()


@pytest.fixture(autouse=True)
def fresh_choice():
    """Each test chooses the builder again, and leaves no simulated machine behind."""
    seccomp.libseccomp.cache_clear()
    yield
    seccomp.libseccomp.cache_clear()


def expected(name: str, arg0: int = 0) -> int:
    """The policy's answer for a call, read from the policy as written."""
    if name in seccomp.REFUSED:
        return pyseccomp.ERRNO(seccomp.REFUSED[name])
    if name == "clone" and arg0 & sum(seccomp.CLONE_FLAGS.values()) & 0xFFFFFFFF:
        return pyseccomp.ERRNO(seccomp.CLONE_ERRNO)
    return ALLOW


def _assembled(machine):
    return seccomp_assembler.assemble(machine, seccomp.REFUSED, sum(seccomp.CLONE_FLAGS.values()),
                                      seccomp.CLONE_ERRNO)


def test_the_filter_here_comes_from_libseccomp_and_says_so():
    built = seccomp.build()
    assert re.fullmatch(r"libseccomp \d+\.\d+\.\d+", built.builder), built.builder
    version = built.builder.split()[1]
    assert built.program == seccomp.libseccomp_program(pyseccomp, version, platform.machine())
    for isolation in (Isolation(BUBBLEWRAP), Isolation(USER, "namespaces refused")):
        assert f"a seccomp filter by {built.builder}" in isolation.summary()


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_both_builders_give_every_call_of_the_policy_the_same_answer(machine):
    """At libseccomp's number for each call on `machine`, clone with each namespace flag, and
    calls the policy allows; x32 calls and another architecture are killed."""
    arch = MACHINES[machine]
    programs = {"libseccomp": seccomp.build(machine).program, "assembler": _assembled(machine)}
    cases = [(name, 0) for name in (*seccomp.REFUSED, *ALLOWED)]
    cases += [("clone", flag | SIGCHLD) for flag in seccomp.CLONE_FLAGS.values()]
    cases += [("clone", SIGCHLD), ("clone", 0x003D0F00), ("clone", 1 << 32 | SIGCHLD)]  # fork, a thread
    for name, arg0 in cases:
        nr = pyseccomp.resolve_syscall(arch, name)
        assert nr >= 0, name
        answers = {builder: run_bpf(program, nr, arch, arg0) for builder, program in programs.items()}
        assert set(answers.values()) == {expected(name, arg0)}, (name, hex(arg0), answers)
    others = {*MACHINES.values(), pyseccomp.Arch.X86, pyseccomp.Arch.ARM} - {arch}
    for builder, program in programs.items():
        for other in others:  # the other machine's calls too: a filter holds one architecture
            assert run_bpf(program, pyseccomp.resolve_syscall(arch, "getpid"), other) == KILL_PROCESS, builder
        if machine == "x86_64":  # an x32 call: the x86-64 audit architecture, the number | X32_BIT
            assert run_bpf(program, X32_BIT | 319, arch) == KILL_PROCESS, builder


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_the_hand_written_numbers_are_libseccomps(machine):
    audit, numbers = seccomp_assembler.SYSCALLS[machine]
    assert audit == MACHINES[machine]
    assert set(numbers) == {*seccomp.REFUSED, "clone"}
    assert {name: pyseccomp.resolve_syscall(audit, name) for name in numbers} == numbers
    assert pyseccomp.resolve_syscall(audit, "seccomp") == seccomp.SECCOMP_SYSCALL[machine]


PROBE = textwrap.dedent('''
    import ctypes, errno, importlib.util, json, os, sys
    spec = importlib.util.spec_from_file_location("seccomp", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    libc = ctypes.CDLL(None, use_errno=True)
    number = json.loads(sys.argv[3])
    def call(name, *args):
        result = libc.syscall(number[name], *[ctypes.c_long(arg) for arg in args])
        return errno.errorcode[ctypes.get_errno()] if result == -1 else "ok"
    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    module.install(bytes.fromhex(sys.argv[2]))
    print(json.dumps({"memfd_create": call("memfd_create", 0, 0), "clone3": call("clone3", 0, 0),
                      "unshare": call("unshare", 0x10000000), "keyctl": call("keyctl", 0, -3, 0),
                      "clone_newuser": call("clone", 0x10000000 | 17, 0, 0, 0, 0),
                      "getppid": call("getppid"), "fork": fork()}))
    ''')


def _probe(program: bytes) -> dict:
    """What the calls of PROBE answer in a process that loaded `program` with `seccomp.install`."""
    arch = MACHINES[platform.machine()]
    number = {name: pyseccomp.resolve_syscall(arch, name)
              for name in ("memfd_create", "clone3", "unshare", "keyctl", "clone", "getppid")}
    done = subprocess.run([sys.executable, "-I", "-c", PROBE, seccomp.__file__, program.hex(),
                           json.dumps(number)], capture_output=True, text=True, timeout=program_backstop())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_kernel_refuses_and_allows_as_the_policy_says_under_each_builder(monkeypatch):
    """Unfiltered, this process may make each refused call; filtered, the kernel refuses it."""
    os.close(os.memfd_create("unfiltered"))
    built = {"libseccomp": seccomp.build()}
    _without_libseccomp(monkeypatch)
    built["assembler"] = seccomp.build()
    assert built["libseccomp"].builder.startswith("libseccomp ")
    assert built["assembler"].builder.startswith(seccomp.ASSEMBLER)
    for builder, filtered in built.items():
        assert _probe(filtered.program) == {
            "memfd_create": "EPERM", "clone3": "ENOSYS", "unshare": "EPERM", "keyctl": "EPERM",
            "clone_newuser": "EPERM", "getppid": "ok", "fork": 7}, builder


def test_without_libseccomp_the_assembler_builds_and_the_sandbox_says_so(monkeypatch):
    _without_libseccomp(monkeypatch)
    built = seccomp.build()
    assert built.builder.startswith(f"{seccomp.ASSEMBLER} (libseccomp cannot be loaded: RuntimeError")
    assert built.program == _assembled(platform.machine())
    assert f"a seccomp filter by {seccomp.ASSEMBLER}" in Isolation(BUBBLEWRAP).summary()


def test_a_call_an_older_libseccomp_does_not_know_falls_back_to_the_assembler_saying_which(monkeypatch):
    real = pyseccomp.resolve_syscall
    monkeypatch.setattr(pyseccomp, "resolve_syscall",
                        lambda arch, name: -1 if name == "memfd_secret" else real(arch, name))
    built = seccomp.build("x86_64")
    assert "does not know the system call(s) memfd_secret on x86_64" in built.builder
    assert built.builder.startswith(seccomp.ASSEMBLER) and built.program == _assembled("x86_64")


def test_a_call_no_builder_knows_and_an_unknown_machine_are_refused_by_name(monkeypatch):
    monkeypatch.setitem(seccomp.REFUSED, "memfd_craete", errno.EPERM)
    unknown = r"libseccomp 2\.5\.4 does not know the system call\(s\) memfd_craete on x86_64"
    with pytest.raises(ValueError, match=unknown):
        seccomp.libseccomp_program(pyseccomp, "2.5.4", "x86_64")
    with pytest.raises(ValueError, match="no number for the system call.s. memfd_craete on aarch64"):
        seccomp.build("aarch64")
    with pytest.raises(ValueError, match=r"machine 'riscv64'; known: aarch64, x86_64"):
        seccomp.build("riscv64")
