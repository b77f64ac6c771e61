"""Fixtures for the install tests: the wheel built from this checkout (bare Pythons: install.py).

A bare Python is a fresh virtual environment (no system site-packages) holding torch (the
version this test runs with, so pip finds it where `make test` found it), Jupyter's kernel and
the versions of ipywidgets and ml_dtypes that Colab preinstalls: what Colab and Kaggle offer,
less this course. Building it installs torch, which takes minutes, so the test file is named
install_checks.py, which `pytest tests/` does not collect; `make hosted` (part of `make test`)
names it.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from install import ROOT, run


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel of this checkout, built by pip as a learner's pip would build it (with the pinned
    backend, in isolation), from a copy of the files it is made of (an in-tree build/ could carry a
    module that no longer exists); and the build's verbose output, the backend's warnings in it."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(ROOT / "mpcourse", source / "mpcourse", ignore=shutil.ignore_patterns("__pycache__"))
    done = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--wheel-dir", str(out),
                str(source)])
    (wheel,) = out.glob("mpcourse-*.whl")
    return wheel, done.stdout + done.stderr


@pytest.fixture(scope="session")
def wheel(built) -> Path:
    return built[0]
