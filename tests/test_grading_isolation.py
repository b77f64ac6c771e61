"""Nothing shared between sandboxes, and a grader process no reply can exhaust (issue 28).

Every attack here runs inside the sandbox; the grader's side is attacked with forged replies
and crashing grading processes. The hostile notebooks of tests/fixtures/submissions that go with
these (keyring, threads, kernel memory, reply lines, giant shapes, slow tests, surrogates) are
graded with all the others by tests/test_grading.py."""
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

from mpcourse.grading import codec, gradebook, grader, pool, seccomp
from mpcourse.grading.gradebook import SubmissionResult
from mpcourse.grading.pool import grade_in_processes
from mpcourse.grading.sandbox import Limits, Sandbox, WorkerGone

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a uid and a control group per sandbox need root")

PROBE = textwrap.dedent('''
    import ctypes, errno, os, threading, subprocess
    libc = ctypes.CDLL(None, use_errno=True)
    def refused(number, *args):
        result = libc.syscall(number, *args)
        return result == -1 and ctypes.get_errno() == errno.EPERM
    def memfd():
        try:
            os.close(os.memfd_create("probe"))
            return False
        except OSError as error:
            return error.errno == errno.EPERM
    def fills(path):  # two files of 40 MiB: each under the 64 MiB a file may have
        try:
            for part in ("a", "b"):
                with open(path + part, "wb") as f:
                    for _ in range(40):
                        f.write(bytes(1 << 20))
            return "80 MiB"
        except OSError as error:
            return errno.errorcode[error.errno]
    seen = threading.Thread(target=lambda: None)
    seen.start(); seen.join()
    probe = {
        "memfd_create": memfd(), "keyctl": refused(250, 0, -3, 0), "add_key": refused(248, b"user", b"k", b"v", 1, -4),
        "shmget": refused(29, 0, 4096, 0o1000), "unshare_user": refused(272, 0x10000000),
        "uid": os.getuid(), "tmp": fills("/tmp/fill"), "shm": fills("/dev/shm/fill"),
        "home": fills(os.path.expanduser("~/fill")), "subprocess": subprocess.run(["/bin/true"]).returncode,
    }''')


def _probe(worker, deadline):
    worker.request({"op": "run_cell", "source": PROBE}, deadline)
    return codec.decode(worker.request({"op": "value", "name": "probe"}, deadline)["value"])


def test_the_filter_is_classic_bpf_for_each_machine_and_names_an_unknown_one():
    for machine in ("x86_64", "aarch64"):
        program = seccomp.filter_program(machine)
        assert len(program) % 8 == 0 and 20 < len(program) // 8 < 256
        assert program[:8] == bytes([0x20, 0, 0, 0, 4, 0, 0, 0])  # load the architecture first
    with pytest.raises(ValueError, match="'sparc'.*known: aarch64"):
        seccomp.filter_program("sparc")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 syscall numbers")
def test_the_sandbox_refuses_what_escapes_its_limits_and_bounds_what_it_may_write():
    """The same calls succeed in this process: the sandbox's filter, not the kernel, refuses them."""
    os.close(os.memfd_create("outside"))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(250, 0, -3, 0) > 0  # KEYCTL_GET_KEYRING_ID of this session's keyring
    deadline = time.monotonic() + 120
    with Sandbox(Limits(), deadline) as worker:
        probe = _probe(worker, deadline)
    assert all(probe[call] for call in ("memfd_create", "keyctl", "add_key", "shmget", "unshare_user")), probe
    assert probe["subprocess"] == 0
    # writable, and bounded: the 80 MiB write stops at the 64 MiB tmpfs
    assert probe["tmp"] == probe["shm"] == "ENOSPC", probe
    assert probe["home"] == "80 MiB"  # the home holds 256 MiB
    if os.geteuid() == 0:
        assert probe["uid"] >= 1_000_000_000


@ROOT_ONLY
def test_sandboxes_running_at_once_have_their_own_uid_and_control_group():
    deadline = time.monotonic() + 120
    with Sandbox(Limits(), deadline) as a, Sandbox(Limits(), deadline) as b:
        uids = [_probe(w, deadline)["uid"] for w in (a, b)]
        groups = [w.cgroup for w in (a, b)]
        assert uids[0] != uids[1] and min(uids) >= 1_000_000_000
        if groups[0] is not None:  # a machine that lends us control groups: the limits are written there
            assert groups[0].folders != groups[1].folders
            assert any((f / "cgroup.procs").read_text().split() for f in groups[0].folders)
    assert not any(f.exists() for g in groups if g for f in g.folders), "a control group outlived its sandbox"


@ROOT_ONLY
def test_a_sandbox_holding_every_thread_it_may_leaves_a_classmate_its_own():
    """The attack of issue 28: 2,000 threads in one sandbox once cost classmates their marks."""
    limits, deadline = Limits(processes=300), time.monotonic() + 120
    hoard = ("import threading, time\nthreading.stack_size(256 << 10)\nheld = []\n"
             "try:\n    while len(held) < 5000:\n"
             "        held.append(threading.Thread(target=time.sleep, args=(600,), daemon=True)); held[-1].start()\n"
             "except RuntimeError:\n    pass\ncount = len(held)")
    classmate = ("import threading\nevents = [threading.Event() for _ in range(200)]\n"
                 "started = [threading.Thread(target=e.wait) for e in events]\n"
                 "[t.start() for t in started]\n[e.set() for e in events]\n[t.join() for t in started]\n"
                 "count = len(started)")
    with Sandbox(limits, deadline) as hoarder, Sandbox(limits, deadline) as other:
        hoarder.request({"op": "run_cell", "source": hoard}, deadline)
        held = hoarder.request({"op": "value", "name": "count"}, deadline)["value"]
        other.request({"op": "run_cell", "source": classmate}, deadline)
        assert other.request({"op": "value", "name": "count"}, deadline)["value"] == 200
    assert 100 < held < limits.processes, held


def test_a_reply_line_over_the_cap_stops_the_worker_and_forged_lines_are_not_parsed():
    deadline = time.monotonic() + 120
    flood = ("import os, stat\nfor fd in range(3, 12):\n    try:\n"
             "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
             "            os.write(fd, b'{\"value\": 1, \"id\": 9}\\n' + b'[' + b'0,' * (3 << 19))\n"
             "    except OSError:\n        pass")
    with Sandbox(Limits(reply=1 << 20), deadline) as worker:
        with pytest.raises(WorkerGone, match="reply line over 1 MiB"):
            worker.request({"op": "run_cell", "source": flood}, deadline)
    # under the byte cap, 2 million empty lists answering the pending request (its number is 1):
    # parsing them would build 2 million Python lists
    lists = ("import os, stat\nfor fd in range(3, 12):\n    try:\n"
             "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
             "            os.write(fd, b'{\"value\": [' + b'[],' * (2 << 20) + b'[]], \"id\": 1}\\n')\n"
             "    except OSError:\n        pass")
    with Sandbox(Limits(), deadline) as worker:
        with pytest.raises(WorkerGone, match="reply of over 1,048,576 items"):
            worker.request({"op": "run_cell", "source": lists}, deadline)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    assert peak < 4 << 30  # sanity: nothing here grew the test process by gigabytes


def test_tensor_sizes_are_checked_before_anything_is_allocated():
    empty = codec.encode(torch.empty(30_000_000, 0))
    assert len(json.dumps(empty)) < 100
    with pytest.raises(codec.MalformedData, match="spanning over"):
        codec.decode(empty)
    assert codec.decode(codec.encode(torch.empty(1000, 0))).shape == (1000, 0)
    huge = {"$": "tensor", "dtype": "float64", "shape": [4096, 1024], "data": ""}  # 32 MiB claimed, none sent
    with pytest.raises(codec.MalformedData, match="over the 16 MiB"):
        codec.decode(huge)
    with pytest.raises(codec.MalformedData, match="at most 16"):
        codec.decode({"$": "tensor", "dtype": "float32", "shape": [1] * 17, "data": ""})
    with pytest.raises(codec.MalformedData, match="not the base64 of 2"):
        codec.decode({"$": "tensor", "dtype": "float32", "shape": [2], "data": "A" * 1000})


def test_the_grader_stays_small_whatever_the_hostile_replies():
    """A 125 MiB reply line once cost the grader 1 GB, a 70-byte empty tensor 2.2 GB: the grading
    process's own peak (its sandboxes not counted) grows by less than 300 MiB over its baseline."""
    script = textwrap.dedent(f'''
        import json, resource, time
        from mpcourse.grading import judge
        from mpcourse.grading.grader import Options, grade_submission, load_exercises
        from mpcourse.grading.sandbox import Limits
        exercises = load_exercises({str(ROOT / "solutions")!r})
        plans = {{"ex00": judge.calibrate(exercises["ex00"], time.monotonic() + 300, Limits())}}
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scores = {{name: grade_submission({str(FIXTURES)!r} + "/" + name + ".ipynb", exercises, plans,
                                          Options(timeout=60)).score
                  for name in ("ex00_huge_reply_line", "ex00_empty_giant_tensor", "ex00_kernel_memory_hoard")}}
        print(json.dumps({{"base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "scores": scores}}))
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.splitlines()[-1])
    assert measured["scores"] == {"ex00_huge_reply_line": 4, "ex00_empty_giant_tensor": 0,
                                  "ex00_kernel_memory_hoard": 4}, measured
    assert (measured["peak"] - measured["base"]) << 10 < 300 << 20, measured


def _fake_grade(folder: Path):
    def grade(path):
        name = Path(path).name
        attempts = folder / f"{name}.attempts"
        attempts.write_text(str(int(attempts.read_text() if attempts.exists() else 0) + 1))
        if name == "always_killed" or (name == "killed_once" and attempts.read_text() == "1"):
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
        return SubmissionResult(name, "ex00_bytes", 4.0, 4.0, None)
    return grade


def test_a_killed_grading_process_is_retried_once_and_costs_no_classmate_its_grade(tmp_path):
    paths = ["honest_a", "always_killed", "killed_once", "honest_b"]
    out = {index: (result, why) for index, result, why in
           grade_in_processes(paths, _fake_grade(tmp_path), lambda path: 60, jobs=2, memory=8 << 30)}
    assert [out[i][0].score if out[i][0] else None for i in range(4)] == [4.0, None, 4.0, 4.0]
    assert "killed by SIGKILL (attempt 2 of 2)" in out[1][1]
    assert (tmp_path / "always_killed.attempts").read_text() == "2"


def test_a_grading_process_past_its_time_is_stopped_and_says_so(monkeypatch):
    def grade(path):
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # a grading process stuck where no alarm reaches
        time.sleep(600)
    monkeypatch.setattr(pool, "GRACE", 1.0)
    start = time.monotonic()
    ((index, result, why),) = list(grade_in_processes(["stuck"], grade, lambda path: 1, jobs=1, memory=8 << 30))
    assert result is None and "ran past 2 s and was killed" in why
    assert time.monotonic() - start < 60


def test_the_exit_status_says_which_submission_could_not_be_graded_and_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grader, "plan_exercises", lambda *args: {})
    monkeypatch.setattr(grader, "grade_submission", lambda path, *args: _fake_grade(tmp_path)(path))
    args = SimpleNamespace(paths=["honest_a", "always_killed", "honest_b"], solutions=str(ROOT / "solutions"),
                           timeout=60.0, jobs=2, csv=str(tmp_path / "grades.csv"), json=False, unsafe_no_sandbox=False)
    assert grader.grade_command(args) == grader.NOT_GRADED
    out, err = capsys.readouterr()
    assert "1 submission(s) could not be graded: always_killed: not graded: its grading process died: killed by " \
           "SIGKILL" in err
    assert out.count("4/4") == 4  # two results and two summary rows
    rows = (tmp_path / "grades.csv").read_text().splitlines()
    assert any(row.startswith("always_killed,") and "not graded" in row for row in rows)


def _stub_solutions(folder: Path):
    """A learner's own `solutions` folder: the ex00 solution with every test made to pass."""
    nb = nbformat.read(ROOT / "solutions" / "ex00_bytes.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            cell.source = "pass"
    folder.mkdir()
    nbformat.write(nb, folder / "ex00_bytes.ipynb")


def test_paths_the_grader_trusts(tmp_path):
    """From a submissions folder holding a learner's `solutions`: the course's own solutions are
    used; a link into the solutions folder is refused; a folder named `-h` is a path after `--`;
    a folder whose name is not UTF-8 is graded and shown escaped."""
    subs = tmp_path / "subs"
    subs.mkdir()
    _stub_solutions(subs / "solutions")
    stub = FIXTURES / "ex00_keyring_thief.ipynb"  # a stub that earns 0 under the real tests
    (subs / "-h").mkdir()
    shutil.copy(stub, subs / "-h" / "ex00_bytes.ipynb")
    (subs / "linked").symlink_to(ROOT / "solutions")
    odd = os.fsdecode(b"caf\xe9")
    (subs / odd).mkdir()
    shutil.copy(FIXTURES / "ex00_correct.ipynb", subs / odd / "ex00_bytes.ipynb")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "mpcourse.cli", "grade", "--timeout", "60", "--csv", "grades.csv",
                           "--", "-h/ex00_bytes.ipynb", "linked/ex00_bytes.ipynb", f"{odd}/ex00_bytes.ipynb"],
                          capture_output=True, cwd=subs, env=env, timeout=900)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    summary = out[out.index("\nsubmission"):]
    assert "-h/ex00_bytes.ipynb" in summary and " 0/4" in summary.splitlines()[2], summary
    assert "refused: this path leads into the solutions folder" in out
    assert "caf\\xe9/ex00_bytes.ipynb" in summary and "4/4" in summary.splitlines()[4], summary
    rows = (subs / "grades.csv").read_text(encoding="utf-8").splitlines()
    assert sum(row.startswith("caf\\xe9/") and ",True," in row for row in rows) == 4


def test_table_json_and_csv_escape_surrogates_and_control_characters(tmp_path):
    odd = SubmissionResult(os.fsdecode(b"x\xff/ex00.ipynb"), "ex00_bytes", 0.0, 4.0, "bad \ud800 \x1b[2J",
                           notes=["bell \x07"])
    shown = gradebook.format_result(odd) + gradebook.format_summary([odd])
    shown.encode("utf-8")  # printable on any UTF-8 terminal: no lone surrogate left
    assert "x\\xff/ex00.ipynb" in shown and "bad \\ud800 \\x1b[2J" in shown and "\x1b" not in shown
    text = json.dumps(odd.to_json(), ensure_ascii=False)
    text.encode("utf-8")
    assert json.loads(text)["error"] == "bad \\ud800 \\x1b[2J"
    gradebook.write_gradebook([odd], tmp_path / "g.csv")
    assert "x\\xff/ex00.ipynb" in (tmp_path / "g.csv").read_text(encoding="utf-8")


def test_a_hard_link_or_a_path_through_a_link_into_the_solutions_is_refused(tmp_path):
    solutions, learner = tmp_path / "solutions", tmp_path / "learner"
    solutions.mkdir()
    learner.mkdir()
    (solutions / "ex00_bytes.ipynb").write_text("{}")
    os.link(solutions / "ex00_bytes.ipynb", learner / "ex00_bytes.ipynb")
    (tmp_path / "linked").symlink_to(solutions)
    (tmp_path / "honest").mkdir()
    (tmp_path / "honest" / "ex00_bytes.ipynb").write_text("{}")  # same bytes, its own file: graded
    options = grader.Options(solutions=solutions.resolve())
    for path, why in [(learner / "ex00_bytes.ipynb", "a hard link"), (tmp_path / "linked" / "ex00_bytes.ipynb",
                                                                       "leads into the solutions folder")]:
        with pytest.raises(grader.SubmissionFailed, match=why):
            grader._refuse_solutions(path, options)
    grader._refuse_solutions(tmp_path / "honest" / "ex00_bytes.ipynb", options)
