"""The Gradescope autograder, run in a simulated Gradescope.

`mpcourse autograder gradescope` writes the zip; each test unpacks it into a temporary root laid
out as Gradescope's /autograder (source, submission, results: the root is a parameter), runs
`setup.sh --check` and `run_autograder` there on real submissions, graded in the bubblewrap
sandbox, and validates results.json against Gradescope's documented schema
(tests/fixtures/gradescope/results.schema.json, written from Gradescope's specs page).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest

from grading_budgets import backstop, program_backstop, sandbox_processes
from mpcourse.grading.judging.exercise import load_exercise
from mpcourse.grading.gradebook import SubmissionResult
from mpcourse.grading.platforms.gradescope_results import Expected, results_json
from mpcourse.grading.platforms.gradescope_run import choose
from mpcourse.grading import grader
from mpcourse.grading.judging import selfcheck
from mpcourse.grading.platforms import gradescope_run

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "fixtures" / "gradescope" / "results.schema.json").read_text())
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
EX00 = load_exercise(ROOT / "solutions" / "ex00_bytes.ipynb")
SETUP_BACKSTOP = backstop(["ex00_bytes.ipynb"], grader.Options().timeout)  # setup.sh --check grades the solution
FORGED = '{"tests": [{"name": "forged", "score": 1000, "max_score": 4}]}'

# An honest answer right for fp32 only (1 point, as tests/fixtures/submissions' ex00_partial earns),
# plus an attack on Gradescope's layout: find results.json's folder and the autograder's source
# anywhere it can look, forge results, read the hidden tests, and leave a process behind that
# keeps forging after grading ends.
# The answer's daemon carries MARKER in its command line, unique per test, so that a test finds its own
# forger and not one of a test running beside it (`sandbox_processes`).
_HOSTILE_TEMPLATE = '''def tensor_bytes(numel, dtype):
    return numel * 4

import os, subprocess, sys
FORGED = %r
MARKER = %r
found = []
for top, folders, files in os.walk("/", onerror=lambda error: None):
    if top.startswith(("/proc", "/sys", "/usr", "/dev")):
        folders[:] = []
        continue
    if "mpcourse-autograder.json" in files or os.path.basename(top) == "results":
        found.append(top)
for folder in found + ["/autograder/results", "../results", "results"]:
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "results.json"), "w") as f:
            f.write(FORGED)
    except OSError:
        pass
daemon = "import os, time\\nos.setsid()\\nwhile True:\\n    [open(p, 'w').write(%%r) for p in %%r if os.path.isdir(os.path.dirname(p))]\\n    time.sleep(0.2)" %% (FORGED, [os.path.join(d, "results.json") for d in found] + ["/autograder/results/results.json"])
subprocess.Popen([sys.executable, "-c", daemon + "\\n# " + MARKER], start_new_session=True)'''


def hostile_answer() -> tuple[str, str]:
    """An ex00 answer that forges Gradescope's results.json and leaves a daemon rewriting it, and
    the marker its daemon's command line carries."""
    marker = f"forger-{uuid.uuid4().hex}"
    return _HOSTILE_TEMPLATE % (FORGED, marker), marker


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "mpcourse.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=backstop(["ex00_bytes.ipynb"], grader.Options().timeout))


@pytest.fixture(scope="module")
def ex00_zip(tmp_path_factory):
    out = tmp_path_factory.mktemp("zip") / "ex00.zip"
    done = _cli("autograder", "gradescope", "--solutions", "solutions", "--out", str(out), "ex00_bytes")
    assert done.returncode == 0, done.stderr
    return out


def gradescope_root(folder: Path, autograder: Path) -> Path:
    """Lay out Gradescope's /autograder under `folder` from the zip, as its image build does."""
    root = folder / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "results").mkdir()
    with zipfile.ZipFile(autograder) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():  # extractall drops the mode bits; Gradescope keeps them
            os.chmod(root / "source" / info.filename, (info.external_attr >> 16) & 0o777)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    return root


def run_autograder(root: Path, *uploads: tuple[str, Path | str]) -> dict:
    for name, content in uploads:
        (root / "submission" / name).write_bytes(Path(content).read_bytes() if isinstance(content, Path)
                                                 else content.encode())
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), MPCOURSE_PYTHON=sys.executable)
    done = subprocess.run([str(root / "run_autograder")], capture_output=True, text=True, env=env, cwd=root,
                          timeout=backstop([u[0] for u in uploads], grader.Options().timeout))
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(results, SCHEMA)
    assert_no_total_in_sight(results)
    return results


def assert_no_total_in_sight(results: dict) -> None:
    """Gradescope hides a learner's total while tests are hidden: no results.json may state one,
    nor any score of an exercise that has hidden tests."""
    assert "score" not in results, "a top-level score is a total in sight of the learner"
    hidden = {t["name"].split(":")[0] for t in results["tests"] if t["visibility"] != "visible"}
    for exercise in hidden:
        assert not re.search(rf"{exercise}: [0-9.]+/[0-9.]+", results["output"]), results["output"]


def scores(results: dict) -> dict:
    return {t["name"]: (t["score"], t["max_score"]) for t in results["tests"]}


def total(results: dict) -> float:
    return sum(t["score"] for t in results["tests"])


def test_the_zip_has_gradescopes_files_at_its_root_executable(ex00_zip):
    with zipfile.ZipFile(ex00_zip) as zf:
        names = {info.filename: info for info in zf.infolist()}
        config = json.loads(zf.read("mpcourse-autograder.json"))
    for script in ("setup.sh", "run_autograder"):
        assert (names[script].external_attr >> 16) & 0o111 == 0o111, f"{script} is not executable in the zip"
    assert "solutions/ex00_bytes.ipynb" in names and "course/pyproject.toml" in names
    with zipfile.ZipFile(ex00_zip) as zf:  # the course's lock travels with it, and setup.sh installs that file
        assert zf.read("course/requirements-lock.txt") == (ROOT / "requirements-lock.txt").read_bytes()
        setup = zf.read("setup.sh").decode()
    assert 'LOCK="$SOURCE/course/requirements-lock.txt"' in setup and '--require-hashes -r "$LOCK"' in setup
    assert "@TORCH_SPEC@" not in setup and 'TORCH_SPEC="${TORCH_SPEC:-torch==' in setup
    assert "course/mpcourse/grading/platforms/gradescope_run.py" in names
    assert not any("__pycache__" in name for name in names)
    assert [e["name"] for e in config["exercises"]] == ["ex00_bytes"]
    assert config["exercises"][0]["tests"] == [[t.id, t.points] for t in EX00.tests]
    assert config["exercises"][0]["hidden"] == ["any_size_matches_torch"]  # the one test with hidden lines


def test_setup_check_mode_passes_in_the_simulated_root(ex00_zip, tmp_path):
    root = gradescope_root(tmp_path, ex00_zip)
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), MPCOURSE_PYTHON=sys.executable)
    done = subprocess.run(["bash", str(root / "source" / "setup.sh"), "--check"], capture_output=True, text=True,
                          env=env, timeout=SETUP_BACKSTOP)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bubblewrap sandbox works" in done.stdout and "ready" in done.stdout


def test_setup_check_mode_fails_when_the_solutions_do_not_match(ex00_zip, tmp_path):
    root = gradescope_root(tmp_path, ex00_zip)
    config = json.loads((root / "source" / "mpcourse-autograder.json").read_text())
    config["exercises"][0]["tests"][0][1] = 7.0  # points that the solution does not give
    (root / "source" / "mpcourse-autograder.json").write_text(json.dumps(config))
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), MPCOURSE_PYTHON=sys.executable)
    done = subprocess.run(["bash", str(root / "source" / "setup.sh"), "--check"], capture_output=True, text=True,
                          env=env, timeout=SETUP_BACKSTOP)
    assert done.returncode == 1 and "NOT ready" in done.stdout


def test_the_solution_scores_full_marks(ex00_zip, tmp_path):
    results = run_autograder(gradescope_root(tmp_path, ex00_zip), ("ex00_bytes.ipynb", ROOT / "solutions" / "ex00_bytes.ipynb"))
    assert scores(results) == {f"ex00_bytes: {t.id}": (t.points, t.points) for t in EX00.tests}
    assert all(t["status"] == "passed" for t in results["tests"])
    assert "ex00_bytes: graded; its total is not shown while some of its tests are hidden" in results["output"]


def test_the_released_exercise_scores_zero_with_reasons(ex00_zip, tmp_path):
    # uploaded under another name: a single notebook is the exercise whatever it is called
    results = run_autograder(gradescope_root(tmp_path, ex00_zip), ("homework (2).ipynb", ROOT / "exercises" / "ex00_bytes.ipynb"))
    assert total(results) == 0 and len(results["tests"]) == len(EX00.tests)
    assert all(t["status"] == "failed" and "NotImplementedError" in t["output"] for t in results["tests"])
    visibility = {t["name"]: t["visibility"] for t in results["tests"]}
    assert visibility["ex00_bytes: any_size_matches_torch"] == "after_published"
    assert visibility["ex00_bytes: fp32_ten_million"] == "visible"


@pytest.mark.parametrize("fixture", ["ex00_partial", "ex00_detached_process", "ex00_sabotage", "ex00_os_exit"])
def test_fixture_submissions_score_what_the_local_grader_gives_them(ex00_zip, tmp_path, fixture):
    results = run_autograder(gradescope_root(tmp_path, ex00_zip), (f"{fixture}.ipynb", FIXTURES / f"{fixture}.ipynb"))
    assert total(results) == MANIFEST[fixture]["score"], results["output"]


def test_a_submission_attacking_gradescopes_layout_scores_its_honest_work(ex00_zip, tmp_path):
    nb = nbformat.read(ROOT / "exercises" / "ex00_bytes.ipynb", as_version=4)
    answer = next(c for c in nb.cells if c.cell_type == "code" and "def tensor_bytes" in c.source)
    answer.source, marker = hostile_answer()
    root = gradescope_root(tmp_path, ex00_zip)
    results = run_autograder(root, ("ex00_bytes.ipynb", nbformat.writes(nb)))
    assert total(results) == MANIFEST["ex00_partial"]["score"] == 1, results["output"]
    written = (root / "results" / "results.json").read_text()
    # no wait for a process left behind to rewrite it: none is left that could
    assert sandbox_processes(marker) == [], "the forging process outlived grading"
    assert (root / "results" / "results.json").read_text() == written
    assert "forged" not in written and not list(root.rglob("results.json"))[1:]


def test_two_notebooks_for_one_exercise_are_reported_not_guessed(tmp_path):
    uploads = [tmp_path / "ex00_try1.ipynb", tmp_path / "ex00_try2.ipynb"]
    chosen, problems = choose(uploads, [Expected("ex00_bytes", (("a", 1.0),))])
    assert chosen == {} and "2 notebooks could be this exercise" in problems[0]
    chosen, problems = choose(uploads + [tmp_path / "ex00_bytes.ipynb"], [Expected("ex00_bytes", (("a", 1.0),))])
    assert chosen == {"ex00_bytes": tmp_path / "ex00_bytes.ipynb"}
    assert problems == ["ex00_bytes: graded ex00_bytes.ipynb; also uploaded, not graded: ex00_try1.ipynb, "
                        "ex00_try2.ipynb"]
    chosen, problems = choose([tmp_path / "ex05_scaler_update.ipynb"], [Expected("ex00_bytes", (("a", 1.0),))])
    assert chosen == {} and "this assignment is ex00_bytes" in problems[0]  # the wrong exercise, not graded as ex00


def test_results_json_escapes_what_a_submission_wrote_and_validates():
    reason = "got '\ud800<script>alert(1)</script>\x1b[31m'" + "x" * 10_000
    result = SubmissionResult("p", "ex00_bytes", 0.0, 2.0, "a code cell raised \x07Boom", [
        selfcheck.TestResult("a", 0.0, 1.0, False, reason), selfcheck.TestResult("b", 1.0, 1.0, True, None)], notes=["note\n2"])
    results = results_json([Expected("ex00_bytes", (("a", 1.0), ("b", 1.0)), frozenset({"b"}))],
                           {"ex00_bytes": result}, "hidden")
    jsonschema.validate(results, SCHEMA)
    text = json.dumps(results, ensure_ascii=False)
    text.encode("utf-8")  # no lone surrogate left: Gradescope's parser gets valid UTF-8
    first = results["tests"][0]
    assert results["test_output_format"] == results["output_format"] == results["test_name_format"] == "text"
    assert "\\ud800" in first["output"] and "\x1b" not in first["output"] and len(first["output"]) <= 4000
    assert results["tests"][1]["visibility"] == "hidden" and "\x07" not in results["output"]
    assert "note 2" in results["output"]


def test_a_test_missing_from_results_fails_the_schema():
    bad = {"tests": [{"name": "x", "max_score": 1}]}  # neither a top-level score nor the test's own
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"score": 1, "tests": [], "visibility": "later"}, SCHEMA)


def test_bad_hidden_visibility_is_refused_naming_the_choices(tmp_path):
    done = _cli("autograder", "gradescope", "--solutions", "solutions", "--out", str(tmp_path / "x.zip"),
                "--hidden-visibility", "sometimes", "ex00_bytes")
    assert done.returncode == 2 and "after_published" in done.stderr
    done = _cli("autograder", "gradescope", "--solutions", "solutions", "--out", str(tmp_path / "x.zip"), "ex99_nope")
    assert done.returncode == 2 and "ex99_nope" in done.stderr and "ex00_bytes" in done.stderr


def test_one_autograder_for_every_exercise_routes_each_notebook_to_its_exercise(tmp_path):
    """The zip holds every exercise; two solutions handed in together each get full marks, by
    their exNN prefix, and every exercise not handed in scores 0. (That the grader gives every solution full marks is tests/test_exercises.py's
    job: grading all twelve here again would add minutes and check nothing new.)"""
    out = tmp_path / "all.zip"
    done = _cli("autograder", "gradescope", "--solutions", "solutions", "--out", str(out), "--all")
    assert done.returncode == 0, done.stderr
    solutions = sorted((ROOT / "solutions").glob("ex*.ipynb"))
    with zipfile.ZipFile(out) as zf:
        config = json.loads(zf.read("mpcourse-autograder.json"))
    assert [e["name"] for e in config["exercises"]] == [p.stem for p in solutions]
    handed_in = [p for p in solutions if p.stem.startswith(("ex00", "ex03"))]
    results = run_autograder(gradescope_root(tmp_path, out), *[(p.name, p) for p in handed_in])
    expected = {f"{p.stem}: {t.id}": (t.points if p in handed_in else 0, t.points)
                for p in solutions for t in load_exercise(p).tests}
    assert scores(results) == expected, results["output"]


def _without_bwrap(tmp_path) -> dict:
    """An environment whose PATH has bash but no bwrap: a container where bubblewrap is missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("bash"), bin_dir / "bash")
    return {"PATH": str(bin_dir)}


def test_without_bubblewrap_the_check_names_the_fallback_or_says_run_autograder_will_refuse(ex00_zip, tmp_path):
    """As root, a container without bwrap still has the fallback sandbox (a uid per submission):
    setup.sh --check names it and exits 0; as any other user nothing can confine a submission."""
    root = gradescope_root(tmp_path, ex00_zip)
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), MPCOURSE_PYTHON=sys.executable, **_without_bwrap(tmp_path))
    check = subprocess.run(["bash", str(root / "source" / "setup.sh"), "--check"], capture_output=True, text=True,
                           env=env, timeout=SETUP_BACKSTOP)
    if os.geteuid() == 0:
        assert check.returncode == 0 and "the fallback sandbox works here" in check.stdout, check.stdout
    else:
        assert check.returncode == 1 and "run_autograder will refuse" in check.stdout, check.stdout


def test_with_no_sandbox_of_any_kind_the_learner_is_told_the_submission_was_received(ex00_zip, tmp_path, monkeypatch):
    """Where neither sandbox can start (not root, no bwrap), every test gets 0 with a message
    that the submission arrived, never "not submitted". Simulated in process: as root here, the
    fallback would start."""
    from mpcourse.grading.sandbox.isolation import NONE, Isolation
    root = gradescope_root(tmp_path, ex00_zip)
    (root / "submission" / "ex00_bytes.ipynb").write_bytes((ROOT / "solutions" / "ex00_bytes.ipynb").read_bytes())
    monkeypatch.setattr(gradescope_run, "choose_isolation", lambda: Isolation(NONE, "no sandbox here (simulated)"))
    config, expected = gradescope_run.read_config(root / "source")
    results = gradescope_run.grade(root, config, expected, root / "results" / "results.json")
    jsonschema.validate(results, SCHEMA)
    assert total(results) == 0
    told = [results["output"]] + [t["output"] for t in results["tests"]]
    assert all("the autograder could not start; your submission was received" in text for text in told), told
    assert not any("not submitted" in text for text in told)


def test_allow_unsandboxed_grades_without_a_sandbox_and_warns(tmp_path, monkeypatch):
    """A zip built with --allow-unsandboxed grades where no sandbox of any kind starts, and says
    so. Simulated in process: as root here, the fallback sandbox would start."""
    from mpcourse.grading.sandbox.isolation import NONE, Isolation
    out = tmp_path / "unsafe.zip"
    assert _cli("autograder", "gradescope", "--out", str(out), "--allow-unsandboxed", "ex00").returncode == 0
    root = gradescope_root(tmp_path, out)
    (root / "submission" / "ex00_bytes.ipynb").write_bytes((ROOT / "solutions" / "ex00_bytes.ipynb").read_bytes())
    monkeypatch.setattr(gradescope_run, "choose_isolation", lambda: Isolation(NONE, "no sandbox here (simulated)"))
    config, expected = gradescope_run.read_config(root / "source")
    results = gradescope_run.grade(root, config, expected, root / "results" / "results.json")
    jsonschema.validate(results, SCHEMA)
    assert total(results) == EX00.max_score
    assert "sandbox" in results["output"]  # the grader's own note that the run was unprotected

def test_a_re_upload_and_an_unplaceable_file_are_reported_to_the_learner(ex00_zip, tmp_path):
    root = gradescope_root(tmp_path, ex00_zip)
    results = run_autograder(root, ("ex00_bytes.ipynb", ROOT / "solutions" / "ex00_bytes.ipynb"),
                             ("ex00_bytes (1).ipynb", ROOT / "exercises" / "ex00_bytes.ipynb"),
                             ("notes.ipynb", ROOT / "exercises" / "ex00_bytes.ipynb"))
    assert total(results) == EX00.max_score  # the exact name is graded
    assert "graded ex00_bytes.ipynb; also uploaded, not graded: ex00_bytes (1).ipynb" in results["output"]
    assert "named after no exercise of this assignment: notes.ipynb" in results["output"]


def _zip_with(tmp_path, *options) -> Path:
    out = tmp_path / "ex00-options.zip"
    done = _cli("autograder", "gradescope", "--solutions", "solutions", "--out", str(out), *options, "ex00_bytes")
    assert done.returncode == 0, done.stderr
    return out


def test_killed_at_gradescopes_limit_it_leaves_a_valid_provisional_results_json(tmp_path):
    """Gradescope kills run_autograder at its timeout: results.json was written before grading
    began, every test at 0 saying grading did not finish, and it stays valid."""
    root = gradescope_root(tmp_path, _zip_with(tmp_path, "--timeout", "600"))
    (root / "submission" / "ex00_bytes.ipynb").write_bytes((FIXTURES / "ex00_endless_loop.ipynb").read_bytes())
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), MPCOURSE_PYTHON=sys.executable)
    harness = subprocess.Popen([str(root / "run_autograder")], env=env, cwd=root, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = root / "results" / "results.json"
    deadline = time.monotonic() + program_backstop()  # only the provisional file is awaited
    while not path.exists() and harness.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(harness.pid, signal.SIGKILL)  # what Gradescope does at its limit
    harness.wait(program_backstop())
    results = json.loads(path.read_text())
    jsonschema.validate(results, SCHEMA)
    assert_no_total_in_sight(results)
    assert total(results) == 0 and len(results["tests"]) == len(EX00.tests)
    assert all("grading did not finish" in t["output"] for t in results["tests"]), results
    assert not list(path.parent.glob(".results.json.*")), "a temporary results file was left behind"


def test_the_total_budget_ends_a_looping_notebook_before_gradescopes_limit(tmp_path):
    """With --total-seconds below --timeout, the run ends within its budget (plus the pool's
    grace for a kill), and results.json says the notebook timed out, for each test."""
    budget, per_notebook = 30, 600
    root = gradescope_root(tmp_path, _zip_with(tmp_path, "--timeout", str(per_notebook),
                                               "--total-seconds", str(budget)))
    start = time.monotonic()
    results = run_autograder(root, ("ex00_bytes.ipynb", FIXTURES / "ex00_endless_loop.ipynb"))
    assert total(results) == 0 and all(t["status"] == "failed" for t in results["tests"])
    assert all(any(why in t["output"] for why in ("timed out", "ran past", "total time ran out"))
               for t in results["tests"]), results
    assert time.monotonic() - start < per_notebook, "the per-notebook timeout was not cut to the budget"
