"""The lock: what is installed is what requirements-lock.txt says, and nothing drifts from it;
`make lab` installs its part for the runtime and JupyterLab alone (requirements-lab.txt); the build
backend is pinned and builds without a deprecation.

`make test-latest` deselects the first test: there, on purpose, nothing is the lock's.
"""
import importlib.util
import re
import warnings
from pathlib import Path

from grading_budgets import program_backstop
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lock", ROOT / "tools" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)
LOCK_TEXT = lock.LOCK.read_text()


def test_installed_packages_are_the_lock():
    """pip freeze, less torch (TORCH_SPEC's), its CUDA runtime, pip and mpcourse itself."""
    wanted = lock.locked_here(LOCK_TEXT)
    have = {name: version for name, version in lock.installed().items()
            if not lock.CUDA_RUNTIME.match(name) and name not in ("pip", "mpcourse")}
    missing = {n: v for n, v in wanted.items() if have.get(n) != v}
    extra = {n: v for n, v in have.items() if n not in wanted}
    assert not missing and not extra, (
        f"this environment is not {lock.LOCK.name}: locked but absent or at another version "
        f"{missing}; installed but not locked {extra}. `make` reinstalls from the lock; after "
        "changing pyproject.toml, run `make lock`")


def test_the_lock_satisfies_every_range_of_pyproject():
    """Every requirement, extras included, has a pin in the lock that its range admits."""
    project = lock.tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for group in project["optional-dependencies"].values()
                                              for r in group]
    pins = {}
    for name, version, _ in lock.pins(LOCK_TEXT):
        pins.setdefault(name, []).append(version)
    for text in requirements:
        requirement = Requirement(text)
        name = lock.normalize(requirement.name)
        if name == "torch":
            continue  # TORCH_SPEC's
        assert name in pins, f"{requirement.name} is in pyproject.toml but not in the lock: run make lock"
        bad = [v for v in pins[name] if not requirement.specifier.contains(v, prereleases=True)]
        assert not bad, f"the lock pins {name} {bad}, outside pyproject's {text!r}: run make lock"


def test_environment_yml_pins_are_the_lock():
    listed = re.findall(r"^\s+- ([A-Za-z0-9._-]+)==([^\s;]+)\s*(?:;\s*(.+?))?\s*$",
                        (ROOT / "environment.yml").read_text(), re.MULTILINE)
    in_yml = [(lock.normalize(n), v, m or "") for n, v, m in listed if n != "torch"]
    assert in_yml == lock.pins(LOCK_TEXT), "environment.yml drifted from the lock: run make lock"
    assert "- -e .[lab,dev,site]" in (ROOT / "environment.yml").read_text()


def test_the_makefile_names_every_extra_and_the_locked_torch():
    makefile = (ROOT / "Makefile").read_text()
    project = lock.tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = re.search(r"^EXTRAS := (.+)$", makefile, re.MULTILINE)[1].split(",")
    assert sorted(extras) == sorted(project["optional-dependencies"])
    torch = re.search(r"^LOCKED_TORCH := (.+)$", makefile, re.MULTILINE)[1]
    assert f"resolved with torch=={torch}" in LOCK_TEXT
    assert f"- torch=={torch}" in (ROOT / "environment.yml").read_text()


#: What a learner's `make lab` must not install: the test and website tools.
NOT_FOR_THE_LAB = {"pytest", "nbval", "hypothesis", "playwright", "sphinx", "myst-nb", "furo", "torchao",
                   "pytest-xdist", "build", "check-jsonschema", "django-static-mathjax"}


def test_the_lab_lock_is_the_locks_part_for_the_runtime_and_jupyterlab():
    project = lock.tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lab_text = lock.LAB_LOCK.read_text()
    assert lab_text == lock.lab_lock(LOCK_TEXT, project), "requirements-lab.txt drifted: run make lock"
    lab = {name for name, _, _ in lock.pins(lab_text)}
    wanted = {lock.normalize(Requirement(r).name)
              for r in project["dependencies"] + project["optional-dependencies"]["lab"]}
    assert wanted - {"torch"} <= lab, sorted(wanted - {"torch"} - lab)
    assert not lab & NOT_FOR_THE_LAB, sorted(lab & NOT_FOR_THE_LAB)
    assert set(lock.pins(lab_text)) <= set(lock.pins(LOCK_TEXT))


def test_the_lab_closure_follows_the_via_annotations():
    """A package enters through any package that requires it, and the test tools stay out."""
    text = ("a==1 \\\n    --hash=sha256:0\n    # via mpcourse (pyproject.toml)\n"
            "b==2 \\\n    --hash=sha256:1\n    # via\n    #   a\n    #   pytest\n"
            "pytest==8 \\\n    --hash=sha256:2\n    # via mpcourse (pyproject.toml)\n"
            "c==3 ; python_full_version < '3.11' \\\n    --hash=sha256:3\n    # via b\n")
    part = lock.lab_lock(text, {"dependencies": ["a>=1"], "optional-dependencies": {"lab": []}})
    assert [(n, v) for n, v, _ in lock.pins(part)] == [("a", "1"), ("b", "2"), ("c", "3")]
    assert "# via b" in part and "pytest==" not in part


def test_make_lab_installs_the_lab_lock_and_make_test_adds_the_whole_lock(tmp_path):
    import subprocess
    plans = {target: subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path}/venv"],
                                    capture_output=True, text=True, timeout=program_backstop()).stdout
             for target in ("lab", "test")}
    assert "-r requirements-lab.txt" in plans["lab"] and "-r requirements-lock.txt" not in plans["lab"]
    assert "-r requirements-lab.txt" in plans["test"] and "-r requirements-lock.txt" in plans["test"]


def test_the_build_backend_is_pinned_and_reads_the_license_without_a_deprecation():
    """pyproject's `license` is an SPDX string, which setuptools reads from 77 on; the pinned backend
    (the lock's setuptools, installed here) applies pyproject.toml without a deprecation warning,
    the warning that printed its block in every build."""
    pyproject = lock.tomllib.loads((ROOT / "pyproject.toml").read_text())
    (backend,) = [Requirement(r) for r in pyproject["build-system"]["requires"]]
    (pin,) = backend.specifier
    assert backend.name == "setuptools" and pin.operator == "==" and int(pin.version.split(".")[0]) >= 77
    assert pyproject["project"]["license"] == "MIT"
    import setuptools
    assert setuptools.__version__ == pin.version, "this environment's setuptools is not the pinned backend"
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_configuration(Distribution(), ROOT / "pyproject.toml")
    deprecations = [str(w.message) for w in caught if "Deprecat" in w.category.__name__]
    assert not deprecations, deprecations


def test_make_labs_editable_install_prints_no_warning_block(tmp_path):
    """The Makefile's own editable-install line, run in a fresh environment, prints no boxed warning:
    neither a deprecation (as `license = { text = ... }` gave) nor the backend's notice on editable
    installs. Either block is the first thing a learner's `make lab` shows. No time limit of its
    own: pip's network timeouts bound the two installs, as they bound `make lab`."""
    import subprocess
    import sys
    venv = tmp_path / "venv"
    make = ["make", "-C", str(ROOT), f"VENV={venv}", f"PYTHON={sys.executable}"]
    subprocess.run([*make, f"{venv}/bin/python"], check=True, capture_output=True)
    plan = subprocess.run([*make, "-n", f"{venv}/.mpcourse-installed"], capture_output=True, text=True).stdout
    (install,) = [line for line in plan.splitlines() if line.rstrip().endswith("-e .")]
    built = subprocess.run(install, shell=True, cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    output = built.stdout + built.stderr
    assert "!!" not in output and "Warning" not in output, output
