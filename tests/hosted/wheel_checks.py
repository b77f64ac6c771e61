"""`pip install` of the built wheel gives the library and the CLI, and nothing of Jupyter's front end."""
from __future__ import annotations

import json
import zipfile

import pytest

import mpcourse
from install import ROOT, bare_python, clean_env, run

#: The modules the wheel must hold: every module of the checkout's package.
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in (ROOT / "mpcourse").rglob("*.py"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    python = bare_python(tmp_path_factory.mktemp("clean-venv"))
    run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], env=clean_env())
    return python


def test_the_wheel_is_named_with_the_single_sourced_version_and_holds_every_module(wheel):
    assert wheel.name.startswith(f"mpcourse-{mpcourse.__version__}-py3-none-any")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [m for m in MODULES if m.replace(".", "/") + ".py" not in names
               and m.replace(".", "/") + "/__init__.py" not in names]
    assert not missing, f"the wheel lacks {missing}"


def test_every_module_imports_and_the_cli_runs_from_the_wheel_alone(installed, tmp_path):
    code = ("import importlib, json, sys\n"
            f"for name in {MODULES!r}:\n    importlib.import_module(name)\n"
            "import mpcourse\n"
            "print(json.dumps({'file': mpcourse.__file__, 'version': mpcourse.__version__}))")
    done = run([str(installed), "-c", code], cwd=tmp_path, env=clean_env())
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["version"] == mpcourse.__version__
    assert "site-packages" in found["file"] and not found["file"].startswith(str(ROOT))
    doctor = run([str(installed.parent / "mpcourse"), "doctor"], cwd=tmp_path, env=clean_env())
    assert "precision" in doctor.stdout and "The lab's size here" in doctor.stdout


def test_jupyterlab_and_the_test_tools_are_not_installed_by_it(installed, tmp_path):
    done = run([str(installed), "-m", "pip", "list", "--format=json"], cwd=tmp_path, env=clean_env())
    names = {p["name"].lower().replace("_", "-") for p in json.loads(done.stdout)}
    assert "mpcourse" in names and "matplotlib" in names
    assert not names & {"jupyterlab", "notebook", "jupyter-server", "nbval", "nbclient", "pytest"}, \
        sorted(names & {"jupyterlab", "notebook", "jupyter-server", "nbval", "nbclient", "pytest"})
