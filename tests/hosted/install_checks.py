"""The package installed as a learner installs it, in a hosted notebook simulated here.

Lessons 00 and 06 and exercise 01 are copied alone into an empty folder and run, under nbval, by a
bare Python: a fresh virtual environment with torch, Jupyter's kernel and nbval, but not mpcourse,
as Colab and Kaggle are. Each notebook's bootstrap cell must install the package, from the wheel
just built (through MPCOURSE_INSTALL_SOURCE, where Colab installs from the repository), and every
stored output must then hold. What that install added to the environment is the wheel with its
requirements alone: the library and the CLI, every module importable, and nothing of JupyterLab
or the test tools. (One environment serves both, as installing torch takes minutes.)
"""
from __future__ import annotations

import json
import shutil
import zipfile

import pytest

import mpcourse
from install import ROOT, bare_python, clean_env, run
from mpcourse.hosted import SOURCE_VARIABLE

NOTEBOOKS = ["notebooks/00_welcome.ipynb", "notebooks/06_training_lab.ipynb", "solutions/ex01_bf16_rounding.ipynb"]
#: Every module of the checkout's package, which the wheel must hold and import.
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in (ROOT / "mpcourse").rglob("*.py"))
#: What a hosted notebook's own Jupyter provides, and `make test` installs: never the wheel.
NOT_RUNTIME = {"jupyterlab", "notebook", "jupyter-server", "nbval", "nbclient", "pytest", "hypothesis"}


def _packages(python, cwd) -> dict[str, str]:
    done = run([str(python), "-m", "pip", "list", "--format=json"], cwd=cwd, env=clean_env())
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(done.stdout)}


@pytest.fixture(scope="module")
def hosted(wheel, tmp_path_factory):
    """The bare Python before and after the notebooks ran in it, and nbval's report."""
    python = bare_python(tmp_path_factory.mktemp("hosted-venv"), "ipykernel", "nbval")
    folder = tmp_path_factory.mktemp("hosted-notebooks")
    found = run([str(python), "-c", "import importlib.util as u; print(u.find_spec('mpcourse'))"],
                cwd=folder, env=clean_env())
    before = _packages(python, folder)
    for notebook in NOTEBOOKS:
        shutil.copy(ROOT / notebook, folder)
    nbval = run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
                 "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"), "-q",
                 *[n.rsplit("/", 1)[1] for n in NOTEBOOKS]],
                cwd=folder, env=clean_env(**{SOURCE_VARIABLE: str(wheel)}), timeout=1500)
    return dict(python=python, folder=folder, found_before=found.stdout.strip(), before=before,
                after=_packages(python, folder), nbval=nbval.stdout)


def test_the_wheel_is_named_with_the_single_sourced_version_and_holds_every_module(wheel):
    assert wheel.name.startswith(f"mpcourse-{mpcourse.__version__}-py3-none-any")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [m for m in MODULES if m.replace(".", "/") + ".py" not in names
               and m.replace(".", "/") + "/__init__.py" not in names]
    assert not missing, f"the wheel lacks {missing}"


def test_lessons_and_an_exercise_install_mpcourse_and_pass_nbval_alone(hosted):
    assert hosted["found_before"] == "None", "the bare Python must not have mpcourse before the notebooks run"
    assert " passed" in hosted["nbval"] and "failed" not in hosted["nbval"], hosted["nbval"][-3000:]
    assert hosted["after"].get("mpcourse") == mpcourse.__version__


def test_the_install_added_the_library_and_nothing_of_jupyterlab_or_the_test_tools(hosted):
    added = set(hosted["after"]) - set(hosted["before"])
    assert {"mpcourse", "matplotlib", "ml-dtypes"} <= added | set(hosted["before"])
    assert not added & NOT_RUNTIME, sorted(added & NOT_RUNTIME)
    assert "jupyterlab" not in hosted["after"]


def test_every_module_imports_and_the_cli_runs_from_the_installed_wheel(hosted):
    code = ("import importlib, json\n"
            f"for name in {MODULES!r}:\n    importlib.import_module(name)\n"
            "import mpcourse\nprint(json.dumps({'file': mpcourse.__file__}))")
    done = run([str(hosted["python"]), "-c", code], cwd=hosted["folder"], env=clean_env())
    file = json.loads(done.stdout.strip().splitlines()[-1])["file"]
    assert "site-packages" in file and not file.startswith(str(ROOT))
    doctor = run([str(hosted["python"].parent / "mpcourse"), "doctor"], cwd=hosted["folder"], env=clean_env())
    assert "precision" in doctor.stdout and "The lab's size here" in doctor.stdout
