"""What the bootstrap cell says in a hosted notebook (Colab, Kaggle), each in one line.

The bootstrap cell (mpcourse/hosted.py) installs the course where it is missing, then calls
`report_install`, and on every run `advise`:

- the install: where it came from and how long it took;
- a restart, when the install upgraded a package that this session had already loaded (Colab's
  ipywidgets 7 under the course's 8): Python keeps the old one until the session restarts;
- what pip's red resolver errors mean, which the cell captures instead of printing: a package
  preinstalled there (JAX, TensorFlow) pins another version of one the course upgraded (ml_dtypes);
- how to get a GPU on that platform, when the session has none, or has one this torch was not
  built for (Kaggle's P100, sm_60); the lessons run on the CPU without one.

Where no hosted platform is found (`make lab`, the grader), `advise` prints nothing and loads
nothing: it reads two environment variables.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    """A hosted notebook service, and the clicks that change its session."""
    name: str
    gpu_steps: str
    restart_steps: str


COLAB = Platform("Colab", "Runtime -> Change runtime type -> T4 GPU", "Runtime -> Restart session")
KAGGLE = Platform("Kaggle",
                  "Settings -> Accelerator -> GPU T4 x2 (not the P100), with Settings -> Internet on",
                  "Run -> Restart & clear cell outputs")
#: pip's resolver error: "tensorflow 2.18.0 requires ml-dtypes<0.5.0,>=0.4.0, but you have ml-dtypes
#: 0.7.0 which is incompatible."
CONFLICT = re.compile(r"^(\S+) (\S+) requires ([A-Za-z0-9._-]+)(.*?), "
                      r"but you have \S+ (\S+) which is incompatible", re.MULTILINE)


def hosted_platform(environ=None) -> Platform | None:
    """Colab (its COLAB_RELEASE_TAG, or google.colab importable), Kaggle (KAGGLE_KERNEL_RUN_TYPE), or None."""
    environ = os.environ if environ is None else environ
    if "KAGGLE_KERNEL_RUN_TYPE" in environ:
        return KAGGLE
    if "COLAB_RELEASE_TAG" in environ or "google.colab" in sys.modules:
        return COLAB
    try:
        return COLAB if importlib.util.find_spec("google.colab") is not None else None
    except ModuleNotFoundError:  # no `google` package at all
        return None


def gpu_advice(platform: Platform, cuda) -> str | None:
    """One line when the session has no GPU that `cuda` (torch.cuda) can use, else None."""
    if not cuda.is_available():
        return (f"No GPU in this {platform.name} session: for the GPU comparisons choose "
                f"{platform.gpu_steps}, then run the notebook from the top; without one every lesson "
                "still runs, on the CPU.")
    major, minor = cuda.get_device_capability()
    built = cuda.get_arch_list()
    runs = f"sm_{major}{minor}" in built or any(
        a.startswith("compute_") and int(a.removeprefix("compute_")) <= major * 10 + minor for a in built)
    if built and not runs:
        return (f"This {platform.name} GPU, {cuda.get_device_name()} (sm_{major}{minor}), is not one this "
                f"torch was built for ({', '.join(built)}): choose {platform.gpu_steps}, then run the "
                "notebook from the top; until then the lessons run on the CPU.")
    return None


def advise(environ=None) -> None:
    """Print the GPU advice on a hosted platform; elsewhere print and import nothing."""
    platform = hosted_platform(environ)
    if platform is None:
        return
    import torch
    line = gpu_advice(platform, torch.cuda)
    if line:
        print(line)


def report_install(source: str, before: dict[str, str], pip_stderr: str, seconds: float) -> None:
    """The install's line, and a line each for a needed restart and for pip's resolver errors."""
    print(f"mpcourse was not installed: installed it with pip from {source} in {seconds:.0f} s")
    stale = upgraded_while_loaded(before)
    if stale:
        platform = hosted_platform() or Platform("Jupyter", "", "Kernel -> Restart Kernel")
        print(f"Restart needed: this session had loaded {', '.join(stale)} before the install upgraded "
              f"it; click {platform.restart_steps}, then run the notebook from the top (this cell then "
              "does nothing).")
    conflicts = resolver_conflicts(pip_stderr)
    if conflicts:
        print(f"pip warned that {'; '.join(conflicts)}: the course imports none of them, so its lessons are "
              "unaffected; only code of yours that imports them here may fail.")


def upgraded_while_loaded(before: dict[str, str]) -> list[str]:
    """'ipywidgets 7.7.1 -> 8.1.9' for each distribution whose version changed and whose modules this
    process has imported (it still runs the old code)."""
    now = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}
    loaded = {dist for module, dists in importlib.metadata.packages_distributions().items()
              if module in sys.modules for dist in dists}
    return sorted(f"{name} {before[name]} -> {now[name]}" for name in loaded
                  if name in before and name in now and before[name] != now[name])


def resolver_conflicts(pip_stderr: str) -> list[str]:
    """'tensorflow 2.18.0 wants ml-dtypes<0.5.0,>=0.4.0 (now 0.7.0)' for each conflict pip reported."""
    return [f"{name} {version} wants {wanted}{spec.strip()} (now {have})"
            for name, version, wanted, spec, have in CONFLICT.findall(pip_stderr)]
