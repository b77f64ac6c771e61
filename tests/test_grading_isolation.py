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
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

from cached_plans import MPCOURSE
from grading_budgets import backstop, program_backstop, sandbox_processes
from mpcourse.grading.instructor import class_run
from mpcourse.grading.judging import codec
from mpcourse.grading import gradebook, grader
from mpcourse.grading.sandbox import pool, seccomp
from mpcourse.grading.gradebook import SubmissionResult
from mpcourse.grading.sandbox.pool import grade_in_processes
from mpcourse.grading.sandbox.isolation import FIRST_UID
from mpcourse.grading.sandbox.limits import Budget, Limits
from mpcourse.grading.sandbox.sandbox import Sandbox, WorkerGone

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


def test_the_fallback_worker_passes_over_import_path_entries_that_are_not_folders(tmp_path):
    """An editable install of the course puts a path hook's key on sys.path; the fallback worker,
    which reroutes Python's folders that its uid cannot search, must leave such an entry alone,
    even in its private 0700 working folder (a relative path there is not searchable by others).
    In a process of its own: loading the worker registers its sibling modules."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    program = textwrap.dedent(f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("worker", {str(ROOT / "mpcourse/grading/sandbox/worker.py")!r})
        worker = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(worker)
        sys.path[:] = ["__editable__.mpcourse-0.1.0.finder.__path_hook__", "", "/usr"]
        worker._keep_python_reachable()
        print(json.dumps(sys.path))
        """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=private,
                          timeout=program_backstop())
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == ["__editable__.mpcourse-0.1.0.finder.__path_hook__", "", "/usr"]


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
    deadline = Budget(60)
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
    deadline = Budget(60)
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
    limits, deadline = Limits(processes=300), Budget(60)
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
    deadline = Budget(60)
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
        from mpcourse.grading.judging import judge
        from mpcourse.grading.grader import Options, grade_submission, load_exercises
        from mpcourse.grading.sandbox.limits import Budget, Limits
        exercises = load_exercises({str(ROOT / "solutions")!r})
        plans = {{"ex00": judge.calibrate(exercises["ex00"], Budget(300), Limits())}}
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scores = {{name: grade_submission({str(FIXTURES)!r} + "/" + name + ".ipynb", exercises, plans,
                                          Options(timeout=60)).score
                  for name in ("ex00_huge_reply_line", "ex00_empty_giant_tensor", "ex00_kernel_memory_hoard")}}
        print(json.dumps({{"base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "scores": scores}}))
    ''')
    names = ["ex00_huge_reply_line", "ex00_empty_giant_tensor", "ex00_kernel_memory_hoard"]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=backstop([f"{n}.ipynb" for n in names], 60))
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
    stuck = 3600.0

    def grade(path):
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # a grading process stuck where no alarm reaches
        time.sleep(stuck)
    monkeypatch.setattr(pool, "GRACE", 1.0)
    start = time.monotonic()
    ((index, result, why),) = list(grade_in_processes(["stuck"], grade, lambda path: 1, jobs=1, memory=8 << 30))
    assert result is None and "ran past 2 s and was killed" in why
    assert time.monotonic() - start < stuck / 4  # killed, not waited for


def test_the_exit_status_says_which_submission_could_not_be_graded_and_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grader, "plan_exercises", lambda *args: {})
    monkeypatch.setattr(grader, "grade_submission", lambda path, *args: _fake_grade(tmp_path)(path))
    args = SimpleNamespace(paths=["honest_a", "always_killed", "honest_b"], solutions=str(ROOT / "solutions"),
                           timeout=60.0, jobs=2, csv=str(tmp_path / "grades.csv"), json=False, unsafe_no_sandbox=False)
    assert class_run.grade_command(args) == class_run.NOT_GRADED
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
    paths = ["-h/ex00_bytes.ipynb", "linked/ex00_bytes.ipynb", f"{odd}/ex00_bytes.ipynb"]
    done = subprocess.run([*MPCOURSE, "grade", "--timeout", "60", "--csv", "grades.csv",
                           "--", *paths], capture_output=True, cwd=subs, env=env, timeout=backstop(paths, 60))
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


# ---- fair under load, and a sandbox wherever the grader runs (issue 33) ----

def test_a_budget_counts_the_sandboxs_cpu_time_not_its_waiting():
    """A test that waits is not an endless loop: its budget is CPU time of the whole sandbox, with
    a wall-clock backstop for one that only waits."""
    with Sandbox(Limits(), Budget(120)) as worker:
        worker.request({"op": "run_cell", "source": "import time\ntime.sleep(3)"}, Budget(1, wall_factor=20))
        with pytest.raises(WorkerGone, match="ran past its budget of 1 s of CPU time") as spun:
            worker.request({"op": "run_cell", "source": "while True:\n    pass"}, Budget(1, wall_factor=1000))
        assert spun.value.timed_out
    with Sandbox(Limits(), Budget(120)) as worker:
        with pytest.raises(WorkerGone, match="ran past the 2 s wall-clock backstop of its 1 s CPU budget"):
            worker.request({"op": "run_cell", "source": "import time\ntime.sleep(3600)"}, Budget(1, wall_factor=2))


@ROOT_ONLY
def test_spinners_after_setsid_share_their_sandboxs_one_cpu_weight():
    """Issue 33's attack: 32 spinners, each after setsid, were 32 scheduling groups and starved an
    honest classmate. In one control group with one CPU weight, the classmate's one busy thread
    gets a fair share (half of what they get together, or so, on 2 cores; 1/33 without)."""
    spin = ("import os\nfor _ in range(32):\n    if os.fork() == 0:\n        os.setsid()\n"
            "        while True:\n            pass")
    busy = "import time\nend = time.monotonic() + 5\nwhile time.monotonic() < end:\n    pass"
    with Sandbox(Limits(), Budget(120)) as spinner, Sandbox(Limits(), Budget(120)) as classmate:
        if spinner.cgroup is None:
            pytest.skip("this machine lends the grader no control groups")
        assert spinner.cgroup.has_cpu_share and classmate.cgroup.has_cpu_share
        spinner.request({"op": "run_cell", "source": spin}, Budget(60))
        before = spinner.cgroup.cpu_seconds(), classmate.cgroup.cpu_seconds()
        classmate.request({"op": "run_cell", "source": busy}, Budget(60))
        theirs, mine = spinner.cgroup.cpu_seconds() - before[0], classmate.cgroup.cpu_seconds() - before[1]
    assert mine >= 0.25 * theirs, (mine, theirs)


NAMESPACES_REFUSED = ('#!/bin/sh\n# bwrap as it fails under Docker\'s default seccomp profile\n'
                      'echo "bwrap: Creating new namespace failed: Operation not permitted" >&2\nexit 1\n')


def _sandbox_files() -> list[str]:
    """Files a sandbox's uid left in the shared temporary folders; the work folders of sandboxes
    that other tests run meanwhile (mpcourse-sandbox-*, each removed with its sandbox) aside."""
    found = []
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        for entry in os.scandir(folder) if os.path.isdir(folder) else ():
            if entry.name.startswith("mpcourse-sandbox-"):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid >= FIRST_UID:
                    found.append(entry.path)
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    """The hostile fixtures that attack a wall of the sandbox (MANIFEST.json's `wall`) graded where
    namespaces are refused: `bwrap` on the PATH fails as it does under Docker's default seccomp
    profile, so the grader takes its fallback sandbox. The other fixtures attack the judging, which
    is the grader's own code whichever sandbox runs the learner's process (tests/test_grading.py)."""
    tmp = tmp_path_factory.mktemp("fallback")
    (tmp / "bin").mkdir()
    (tmp / "bin" / "bwrap").write_text(NAMESPACES_REFUSED)
    (tmp / "bin" / "bwrap").chmod(0o755)
    solutions, submissions = tmp / "solutions", tmp / "submissions"
    shutil.copytree(ROOT / "solutions", solutions)
    shutil.copytree(FIXTURES, submissions)
    digests = {p.name: p.read_bytes() for folder in (solutions, submissions) for p in sorted(folder.glob("*"))}
    manifest = {name: entry for name, entry in json.loads((FIXTURES / "MANIFEST.json").read_text()).items()
                if entry["wall"]}
    paths = [str(submissions / f"{name}.ipynb") for name in manifest]
    # this run's sandbox folders in a scratch folder of its own (others may grade beside it)
    scratch = Path(tempfile.mkdtemp(prefix="mpcourse-fallback-test-"))
    scratch.chmod(0o711)
    env = dict(os.environ, PATH=f"{tmp / 'bin'}:{os.environ['PATH']}", TMPDIR=str(scratch),
               MPCOURSE_SABOTAGE_TARGET=str(solutions / "ex00_bytes.ipynb"))
    done = subprocess.run([*MPCOURSE, "grade", "--solutions", str(solutions), "--timeout",
                           "30", "--jobs", "2", "--json", *paths], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=backstop(paths, 30, jobs=2))
    after = {p.name: p.read_bytes() for folder in (solutions, submissions) for p in sorted(folder.glob("*"))}
    changed = sorted(name for name in digests if after.get(name) != digests[name])
    # what the sandboxes left there: their work folders, or anything of their uids (the grader's
    # own caches, root's, may be there: torch's inductor makes one on some machines)
    left = [str(p) for p in scratch.iterdir()
            if p.name.startswith("mpcourse-sandbox-") or p.stat(follow_symlinks=False).st_uid >= FIRST_UID]
    if not left:
        shutil.rmtree(scratch)
    return SimpleNamespace(done=done, manifest=manifest, changed=changed, survivors=sandbox_processes("613.371"),
                           files=_sandbox_files() + left)


@ROOT_ONLY
def test_where_namespaces_are_refused_the_fallback_grades_every_wall_attack_as_bubblewrap_does(fallback):
    """No fixture that attacks a wall gains (each scores its honest work, MANIFEST.json) or harms
    (files unchanged, nothing left running or written), and the grader says which sandbox it used
    and what it leaves open."""
    done = fallback.done
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sandbox: an unprivileged user per submission" in done.stderr, done.stderr[-2000:]
    assert "Creating new namespace failed: Operation not permitted" in done.stderr and "does not isolate" in done.stderr
    got = {Path(s["path"]).stem: s for s in json.loads(done.stdout)["submissions"]}
    wrong = {name: (expected["score"], got[name]["score"], got[name]["error"]) for name, expected in
             fallback.manifest.items() if got[name]["score"] != expected["score"]
             or (expected["error"] or "") not in (got[name]["error"] or "")
             or (expected["error"] is None and got[name]["error"] is not None)}
    assert wrong == {}, wrong
    assert all(any("graded in the fallback sandbox" in note for note in s["notes"]) for s in got.values())
    assert fallback.changed == [] and fallback.survivors == [] and fallback.files == []


@ROOT_ONLY
def test_gradescope_checks_and_grades_in_the_fallback_where_namespaces_are_refused(tmp_path, monkeypatch):
    """setup.sh --check names the fallback and exits 0; a submission that forges results.json from
    a detached process scores its honest work there too."""
    from test_platforms_gradescope import gradescope_root, hostile_answer, run_autograder
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bwrap").write_text(NAMESPACES_REFUSED)
    (tmp_path / "bin" / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    autograder = tmp_path / "ex00.zip"
    built = subprocess.run([sys.executable, "-m", "mpcourse.cli", "autograder", "gradescope", "--solutions",
                            "solutions", "--out", str(autograder), "ex00_bytes"], capture_output=True, text=True,
                           cwd=ROOT, timeout=backstop(["ex00_bytes.ipynb"], 60))
    assert built.returncode == 0, built.stderr
    root = gradescope_root(tmp_path, autograder)
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), MPCOURSE_PYTHON=sys.executable)
    check = subprocess.run(["bash", str(root / "source" / "setup.sh"), "--check"], capture_output=True, text=True,
                           env=env, timeout=backstop(["ex00_bytes.ipynb"], 60))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "the fallback sandbox works here" in check.stdout and "unprivileged user per submission" in check.stdout
    nb = nbformat.read(ROOT / "exercises" / "ex00_bytes.ipynb", as_version=4)
    answer, marker = hostile_answer()
    next(c for c in nb.cells if c.cell_type == "code" and "def tensor_bytes" in c.source).source = answer
    results = run_autograder(root, ("ex00_bytes.ipynb", nbformat.writes(nb)))
    assert sum(t["score"] for t in results["tests"]) == 1, results["output"]  # the honest part: fp32 only
    assert sandbox_processes(marker) == [], "a detached process outlived the fallback sandbox"
    assert "forged" not in (root / "results" / "results.json").read_text()
