"""Bare Pythons for the install tests, and the commands run in them (see conftest.py)."""
from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run `command`; on failure, fail the test with its output (pip's reasons are in it)."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                    f"{done.stderr[-4000:]}", pytrace=False)
    return done


def bare_python(folder: Path, *packages: str) -> Path:
    """A new virtual environment in `folder` with torch and `packages` only; its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    python = folder / "bin" / "python"
    torch_spec = os.environ.get("MPCOURSE_TEST_TORCH", f"torch=={torch.__version__}")
    index = os.environ.get("TORCH_INDEX")  # as the Makefile: torch alone from that index
    # --no-compile: byte-compiling torch's files took two thirds of its install (15 s against 5 s)
    run([str(python), "-m", "pip", "install", "--quiet", "--no-compile",
         *(["--index-url", index] if index else []), torch_spec])
    run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", *packages])
    return python


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points into the checkout or its .venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    return {**env, **extra}
