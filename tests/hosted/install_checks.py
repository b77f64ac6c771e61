"""The package installed as a learner installs it, in Colab and Kaggle as simulated here.

A bare Python stands for the hosted kernel: a fresh virtual environment with torch, Jupyter's
kernel and the ipywidgets (7.7.1) and ml_dtypes (0.4.1) that Colab preinstalls, but not
mpcourse. Each notebook runs as there (tests/hosted/run_notebook.py): its kernel works in the
platform's folder (`content/`, `kaggle/working/` under a temporary directory), which does not
hold the notebook, with JPY_SESSION_NAME unset and the platform's environment variable set. The
first notebook's bootstrap cell must install the package, from the wheel just built (through
MPCOURSE_INSTALL_SOURCE, where Colab installs from the repository), say so, and say how to get a
GPU; lessons 00 and 06 and ex01's solution then run without an error (lesson 06 whole in Colab's
layout only: elsewhere its one cell that depends on the platform, the bootstrap cell, as
`test_only_the_bootstrap_and_check_depend_on_the_platform` guards). What the install added is
the wheel with its requirements alone: every module importable, the CLI, and nothing of
JupyterLab or the test tools. (One environment serves both layouts, as installing torch takes
minutes: between them mpcourse is uninstalled and the preinstalled versions are put back.)

check() there runs without the notebook's file, from the visible tests the wheel ships: ex01's
solution scores full marks, and the released ex01 scores 0 with a hint for every test.
"""
from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest

import mpcourse
from install import ROOT, bare_python, clean_env, run
from mpcourse.grading.judging.checkable import SHIPPED
from mpcourse.hosted import BOOTSTRAP_ID, SOURCE_VARIABLE

LESSONS = ["notebooks/00_welcome.ipynb", "notebooks/06_training_lab.ipynb"]
#: Lessons run whole in one layout only; the others run their bootstrap cell alone, the one cell
#: whose output depends on the platform (the rest computes the same in any working folder).
ONE_LAYOUT = {"notebooks/06_training_lab.ipynb": "colab"}
SOLVED, RELEASED = "solutions/ex01_bf16_rounding.ipynb", "exercises/ex01_bf16_rounding.ipynb"
#: What Colab preinstalls that the course upgrades (ipywidgets 7 -> 8, ml_dtypes -> 0.7).
PREINSTALLED = ["ipywidgets==7.7.1", "ml_dtypes==0.4.1"]
#: Each platform's working folder and the variable its kernels have (mpcourse.hosted_session).
LAYOUTS = {"colab": ("content", {"COLAB_RELEASE_TAG": "release-colab-simulated"}),
           "kaggle": ("kaggle/working", {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"})}
#: Every module of the checkout's package, which the wheel must hold and import.
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in (ROOT / "mpcourse").rglob("*.py"))
#: What a hosted notebook's own Jupyter provides, and `make test` installs: never the wheel.
NOT_RUNTIME = {"jupyterlab", "notebook", "jupyter-server", "nbval", "nbclient", "pytest", "hypothesis"}


def _packages(python, cwd) -> dict[str, str]:
    done = run([str(python), "-m", "pip", "list", "--format=json"], cwd=cwd, env=clean_env())
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(done.stdout)}


def _run(python, notebook, workdir, env, preload="") -> list[dict]:
    done = run([str(python), str(ROOT / "tests" / "hosted" / "run_notebook.py"), str(notebook), str(workdir),
                *([preload] if preload else [])], cwd=workdir, env=env, timeout=3600)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    return bare_python(tmp_path_factory.mktemp("hosted-venv"), "ipykernel", *PREINSTALLED)


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def hosted(request, python, wheel, tmp_path_factory):
    """The layout's runs: each notebook's cells, the packages before and after, what was found."""
    folder, variables = LAYOUTS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    workdir, opened = root / folder, root / "opened-from"  # the notebooks are read from elsewhere
    workdir.mkdir(parents=True)
    opened.mkdir()
    run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "mpcourse"], env=clean_env())
    run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", *PREINSTALLED], env=clean_env())
    found = run([str(python), "-c", "import importlib.util as u; print(u.find_spec('mpcourse'))"],
                cwd=workdir, env=clean_env()).stdout.strip()
    before = _packages(python, workdir)
    env = clean_env(**{SOURCE_VARIABLE: str(wheel)}, **variables)
    env.pop("JPY_SESSION_NAME", None)
    runs = {}
    for notebook in LESSONS + [SOLVED, RELEASED]:
        copy = opened / notebook.replace("/", "-")
        if ONE_LAYOUT.get(notebook, request.param) == request.param:
            shutil.copy(ROOT / notebook, copy)
        else:
            _bootstrap_only(ROOT / notebook, copy)
        runs[notebook] = _run(python, copy, workdir, env)
    after = _packages(python, workdir)
    return dict(layout=request.param, python=python, workdir=workdir, env=env, found_before=found,
                before=before, after=after, runs=runs)


def _bootstrap_only(notebook: Path, copy: Path) -> None:
    """`notebook` with its bootstrap cell alone, written to `copy`."""
    lesson = json.loads(notebook.read_text())
    lesson["cells"] = [c for c in lesson["cells"] if c.get("id") == BOOTSTRAP_ID]
    copy.write_text(json.dumps(lesson))


def _bootstrap_lines(cells: list[dict]) -> list[str]:
    (cell,) = [c for c in cells if c["id"] == BOOTSTRAP_ID]
    assert cell["error"] is None, cell["error"]
    return cell["text"].strip().splitlines()


def _check_table(cells: list[dict]) -> tuple[str, float, float]:
    """The check() cell's table, and its total as (score, out of)."""
    (cell,) = [c for c in cells if "check(" in c["source"] and "import check" in c["source"]]
    assert cell["error"] is None, cell["error"]
    total = re.search(r"^total\s+([\d.]+)/([\d.]+)", cell["text"], re.MULTILINE)
    assert total, cell["text"]
    return cell["text"], float(total[1]), float(total[2])


def test_the_wheel_is_named_with_the_single_sourced_version_and_holds_every_module(wheel):
    assert wheel.name.startswith(f"mpcourse-{mpcourse.__version__}-py3-none-any")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [m for m in MODULES if m.replace(".", "/") + ".py" not in names
               and m.replace(".", "/") + "/__init__.py" not in names]
    assert not missing, f"the wheel lacks {missing}"
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in SHIPPED.glob("*.json"))
    assert shipped and not set(shipped) - names, f"the wheel lacks check()'s tests {sorted(set(shipped) - names)}"


def test_the_build_prints_no_deprecation(built):
    """The pinned setuptools reads the SPDX license: no SetuptoolsDeprecationWarning block, which
    Colab's and Kaggle's pip printed three times."""
    _, output = built
    assert "Deprecat" not in output, output[output.find("Deprecat") - 300:][:1500]


def test_the_first_lesson_installs_mpcourse_and_says_how_to_get_a_gpu(hosted):
    assert hosted["found_before"] == "None", "the bare Python must not have mpcourse before the notebooks run"
    lines = _bootstrap_lines(hosted["runs"][LESSONS[0]])
    platform = "Colab" if hosted["layout"] == "colab" else "Kaggle"
    installed = r"mpcourse was not installed: installed it with pip from \S+\.whl in \d+ s"
    assert re.fullmatch(installed, lines[0]), lines
    assert len(lines) == 2 and lines[1].startswith(f"No GPU in this {platform} session"), lines
    assert hosted["after"].get("mpcourse") == mpcourse.__version__
    assert _bootstrap_lines(hosted["runs"][LESSONS[1]]) == lines[1:], "installed, the next one only advises"


def test_lessons_and_the_solved_exercise_run_without_an_error(hosted):
    errors = [f"{notebook}: {cell['source'][:80]!r}: {cell['error']}"
              for notebook in LESSONS + [SOLVED] for cell in hosted["runs"][notebook]
              if cell["error"] and "import check" not in cell["source"]]
    assert not errors, errors


def test_the_install_upgraded_the_preinstalled_widgets_and_added_nothing_of_jupyterlab(hosted):
    added = set(hosted["after"]) - set(hosted["before"])
    assert {"mpcourse", "matplotlib"} <= added | set(hosted["before"])
    assert not added & NOT_RUNTIME, sorted(added & NOT_RUNTIME)
    assert hosted["before"]["ipywidgets"].startswith("7.") and hosted["after"]["ipywidgets"].startswith("8.")
    assert tuple(map(int, hosted["after"]["ml-dtypes"].split(".")[:2])) >= (0, 7)


def test_a_session_that_loaded_the_old_widgets_is_told_to_restart(hosted, tmp_path):
    """As when ipywidgets 7 was imported before the bootstrap ran: the upgrade needs a restart."""
    python = hosted["python"]
    run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "mpcourse"], env=clean_env())
    run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", PREINSTALLED[0]], env=clean_env())
    copy = tmp_path / "bootstrap-only.ipynb"
    _bootstrap_only(ROOT / LESSONS[0], copy)
    cells = _run(python, copy, hosted["workdir"], hosted["env"], preload="import ipywidgets")
    clicks = {"colab": "Runtime -> Restart session",
              "kaggle": "Run -> Restart & clear cell outputs"}[hosted["layout"]]
    restart = [line for line in _bootstrap_lines(cells) if line.startswith("Restart needed")]
    assert len(restart) == 1 and "ipywidgets 7.7.1 -> 8." in restart[0] and clicks in restart[0], restart


def test_the_solved_exercise_checks_to_full_marks_without_its_file(hosted):
    table, score, out_of = _check_table(hosted["runs"][SOLVED])
    assert out_of > 0 and score == out_of and "FAIL" not in table, table


def test_the_released_exercise_checks_to_zero_with_hints_without_its_file(hosted):
    table, score, out_of = _check_table(hosted["runs"][RELEASED])
    rows = [line for line in table.splitlines()[1:] if not line.startswith("total")]
    assert out_of > 0 and score == 0 and rows, table
    assert all(" FAIL " in row and row.split("FAIL", 1)[1].strip() for row in rows), table


def test_every_module_imports_and_the_cli_runs_from_the_installed_wheel(hosted):
    code = ("import importlib, json\n"
            f"for name in {MODULES!r}:\n    importlib.import_module(name)\n"
            "import mpcourse\nprint(json.dumps({'file': mpcourse.__file__}))")
    done = run([str(hosted["python"]), "-c", code], cwd=hosted["workdir"], env=clean_env())
    file = json.loads(done.stdout.strip().splitlines()[-1])["file"]
    assert "site-packages" in file and not file.startswith(str(ROOT))
    doctor = run([str(hosted["python"].parent / "mpcourse"), "doctor"], cwd=hosted["workdir"],
                 env=clean_env())
    assert "precision" in doctor.stdout and "The lab's size here" in doctor.stdout


#: What tells the package which hosted platform runs it.
PLATFORM_SIGNS = re.compile(r"hosted_platform|COLAB_RELEASE_TAG|KAGGLE_KERNEL_RUN_TYPE|google\.colab")


def test_only_the_bootstrap_and_check_depend_on_the_platform():
    """ONE_LAYOUT's lessons run only their bootstrap cell in the other layouts: that holds while the
    platform is read by the bootstrap cell's code (mpcourse.hosted, hosted_session) and check()'s
    messages alone, and no other cell of those lessons reaches them. A module that starts asking
    fails here, to be judged first."""
    asking = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "mpcourse").rglob("*.py")
                    if PLATFORM_SIGNS.search(p.read_text()))
    assert asking == ["mpcourse/grading/judging/checkable.py", "mpcourse/hosted.py", "mpcourse/hosted_session.py"], \
        asking
    for notebook in ONE_LAYOUT:
        cells = json.loads((ROOT / notebook).read_text())["cells"]
        reaching = [c.get("id") for c in cells if c["cell_type"] == "code" and c.get("id") != BOOTSTRAP_ID
                    and re.search(r"hosted|check\(|grading", "".join(c["source"]))]
        assert not reaching, f"{notebook}: cells {reaching} depend on the platform: run it whole in every layout"
