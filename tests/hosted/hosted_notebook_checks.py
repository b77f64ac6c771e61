"""A hosted notebook, simulated: lessons 00 and 06 and exercise 01 alone in an empty folder, run by
a Python that has torch, Jupyter's kernel and nbval but not mpcourse. Each notebook's bootstrap
cell must install the package (from the freshly built wheel, through MPCOURSE_INSTALL_SOURCE, as
it installs from the repository in Colab), and every stored output must then hold under nbval.
No network is needed but the package index for the wheel's dependencies."""
from __future__ import annotations

import shutil

import pytest

from install import ROOT, bare_python, clean_env, run
from mpcourse.hosted import SOURCE_VARIABLE

NOTEBOOKS = ["notebooks/00_welcome.ipynb", "notebooks/06_training_lab.ipynb", "solutions/ex01_bf16_rounding.ipynb"]


@pytest.fixture(scope="module")
def hosted_python(tmp_path_factory):
    return bare_python(tmp_path_factory.mktemp("hosted-venv"), "ipykernel", "nbval")


def test_lessons_and_an_exercise_install_mpcourse_and_pass_nbval_alone(hosted_python, wheel, tmp_path):
    missing = run([str(hosted_python), "-c", "import importlib.util as u; print(u.find_spec('mpcourse'))"],
                  cwd=tmp_path, env=clean_env())
    assert missing.stdout.strip() == "None", "the bare Python must not have mpcourse before the notebooks run"
    for notebook in NOTEBOOKS:
        shutil.copy(ROOT / notebook, tmp_path)
    names = [n.rsplit("/", 1)[1] for n in NOTEBOOKS]
    done = run([str(hosted_python), "-m", "pytest", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
                "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"), "-q", *names],
               cwd=tmp_path, env=clean_env(**{SOURCE_VARIABLE: str(wheel)}), timeout=1500)
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-3000:]
    installed = run([str(hosted_python), "-c", "import mpcourse; print(mpcourse.__file__)"],
                    cwd=tmp_path, env=clean_env())
    assert "site-packages" in installed.stdout, "mpcourse came from somewhere other than the wheel's install"
