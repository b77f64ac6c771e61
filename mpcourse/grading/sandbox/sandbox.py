"""A worker process for one submission, inside the sandbox `isolation` chooses, and the grader's
end of its pipes (`Sandbox`).

Every reply is one JSON line echoing its request's number, read under the budget and a size cap: a
line over `Limits.reply` bytes, or of over `Limits.reply_items` JSON items (each would become a
Python object), stops the worker before any of it is parsed, and a line that does not end with the
request's number is dropped unparsed. A worker that dies, stalls, floods its output or answers
nonsense is reported, never trusted.
Time is counted as CPU time of the whole sandbox (`limits.Budget`), read from its control group or
its processes.
"""
from __future__ import annotations

import json
import math
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
from pathlib import Path

from mpcourse.grading.sandbox import landlock, seccomp
from mpcourse.grading.sandbox.cgroup import Cgroup
from mpcourse.grading.sandbox.isolation import (BUBBLEWRAP, NONE, UNSHARE, USER, bwrap_command,
                                                 choose_isolation, landlock_rules, sandbox_uid,
                                                 unshare_allowed)
from mpcourse.grading.sandbox.limits import Budget, Limits, POLL, as_budget, kernel_environment
from mpcourse.grading.sandbox.stopping import stop_signals_held

WORKER = Path(__file__).with_name("worker.py")


REPLY_END = re.compile(rb'"id":\s*(\d{1,12})\s*}\s*$')  # the worker writes the request's number last


class WorkerGone(Exception):
    """The worker died, stalled past its budget, printed too much or broke the protocol."""

    def __init__(self, message: str, overrun: str | None = None):
        super().__init__(message)
        # for a worker stopped by its budget: how it overran ('ran past its budget of...')
        self.overrun = overrun

    @property
    def timed_out(self) -> bool:
        return self.overrun is not None


class RequestFailed(Exception):
    """The worker is alive but answered a request with a failure (a missing name, bad data...)."""


_LIVE: set["Sandbox"] = set()  # this process's sandboxes not yet closed
_STOPPING = threading.Event()  # set by stop_every_sandbox: no sandbox starts any more


def stop_every_sandbox() -> None:
    """Kill every sandbox this process holds, with all it started, and start no more: what a
    grading process (or the grader, while it plans) does when it is told to stop. Safe to call
    from a signal handler: a sandbox is registered before its start returns, with those signals
    held back while it is being started."""
    _STOPPING.set()
    for sandbox in list(_LIVE):
        sandbox.kill()
        sandbox._release()


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

    def __init__(self, limits: Limits, deadline: Budget | float,
                 sandboxed: bool = True, trusted: bool = False,
                 kind: str | None = None):
        self.limits, self.printed, self.flooded, self.tail = limits, 0, False, b""
        self.kind = (kind or choose_isolation().kind) if sandboxed else NONE
        if _STOPPING.is_set():
            raise WorkerGone("could not start: the grader is stopping")
        if sandboxed and self.kind not in (BUBBLEWRAP, USER):
            raise RuntimeError(f"no sandbox can be made here: {choose_isolation().problem}")
        if self.kind == USER and os.geteuid() != 0:
            raise RuntimeError("the unprivileged-user sandbox needs a grader running as root")
        self.cgroup, self.uid, self.workdir = None, None, None
        config = self._limits_config(sandboxed)
        command, env, cwd, passed = self._command(config, trusted)
        self._spawn(command + [json.dumps(config)], env, cwd, passed)
        self._buffer, self._requests, self._cpu, self._cpu_read = bytearray(), 0, 0.0, 0.0
        self._drain = threading.Thread(target=self._count_output, daemon=True)
        self._drain.start()
        try:
            self._receive(as_budget(deadline))  # {"ready": true} once torch is loaded and the limits are set
        except WorkerGone:
            self.close()
            raise

    def _limits_config(self, sandboxed: bool) -> dict:
        """The limits the worker sets on itself; as root, a uid and a control group of its own."""
        limits = self.limits
        config = {"memory": limits.memory, "cpu": limits.cpu, "file_size": limits.file_size,
                  "open_files": limits.open_files}
        if sandboxed and os.geteuid() == 0:
            self.uid = sandbox_uid()
            config.update(user=self.uid, processes=limits.processes)
            self.cgroup = Cgroup.create(limits.resident, limits.processes)
        elif sandboxed:  # the limit counts all this user's processes and threads, the grader's included
            config.update(processes=_tasks_of(os.geteuid()) + limits.processes)
        return config

    def _command(self, config: dict, trusted: bool) -> tuple[list[str], dict, str, list[int]]:
        """The worker's command line, environment, folder and passed file descriptors, for its kind."""
        command, passed = [sys.executable, "-I", str(WORKER)], []
        if self.kind == BUBBLEWRAP:  # its home and /tmp are small memory file systems that vanish with it
            passed = [seccomp.filter_fd()]
            command = bwrap_command(self.limits, passed[0]) + command
            env, cwd = {"PATH": "/usr/bin:/bin"}, "/"
        elif self.kind == USER:  # a private folder of its own uid; the worker loads the seccomp filter itself
            self.workdir = cwd = tempfile.mkdtemp(prefix="mpcourse-sandbox-")
            os.chown(cwd, self.uid, self.uid)
            config.update(seccomp=seccomp.filter_program().hex())  # the grader's filter, loaded by the worker
            if landlock.abi():
                config.update(landlock=landlock_rules(cwd))
            command = (UNSHARE if unshare_allowed() else []) + command
            env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd,
                   "IPYTHONDIR": os.path.join(cwd, ".ipython"),
                   "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", **kernel_environment()}
        else:
            self.workdir = cwd = tempfile.mkdtemp(prefix="mpcourse-grade-")
            home = {"HOME": cwd, "IPYTHONDIR": os.path.join(cwd, ".ipython"), "MPLBACKEND": "Agg"}
            env = (dict(os.environ, **home) if trusted
                   else dict(home, PATH="/usr/bin:/bin", **kernel_environment()))
        if self.cgroup is not None:
            command = self.cgroup.wrap(command)
        return command, env, cwd, passed

    def _spawn(self, command: list[str], env: dict, cwd: str, passed: list[int]) -> None:
        """Start the worker in a session of its own and register it, the stop signals held:
        `stop_every_sandbox` then finds every worker started, or (called from the main thread
        while another thread starts one) this start sees it was called and kills its worker."""
        try:
            with stop_signals_held():
                self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, cwd=cwd, env=env,
                                                start_new_session=True, pass_fds=passed)
                _LIVE.add(self)
        except BaseException:
            self._release()
            raise
        finally:
            for fd in passed:
                os.close(fd)
        if _STOPPING.is_set():
            self.kill()
            self.process.wait()
            self._release()
            raise WorkerGone("could not start: the grader is stopping")

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
            print(f"[worker {what}, exit {self.process.returncode}] {self.tail.decode(errors='replace')}",
                  file=sys.stderr)
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
        _LIVE.discard(self)
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
