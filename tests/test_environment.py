"""The lock: what is installed is what requirements-lock.txt says, and nothing drifts from it.

`make test-latest` deselects the first test: there, on purpose, nothing is the lock's.
"""
import importlib.util
import re
from pathlib import Path

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
