"""What the bootstrap cell says in a hosted notebook (Colab, Kaggle), each in one line.

The bootstrap cell (mpcourse/hosted.py) installs the course where it is missing, then calls
`report_install`, and on every run `advise`:

- the install: where it came from and how long it took;
- a restart, when the install upgraded a package that this session had already loaded (Colab's
  ipywidgets 7 under the course's 8): Python keeps the old one until the session restarts;
- what pip's red resolver errors mean, which the cell captures instead of printing: a package
  preinstalled there (JAX, TensorFlow) pins another version of one the course upgraded (ml_dtypes);
- how to get a GPU on that platform, when the session has none, or has one this torch has no
  kernels for (`runs_on`: Kaggle's P100, sm_60, under a build that starts at sm_70 or sm_75);
  the lessons run on the CPU without one.

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
    capability = tuple(cuda.get_device_capability())
    built = cuda.get_arch_list()
    understood = [arch for arch in built if ARCH.match(arch)]
    if understood and not any(runs_on(arch, capability) for arch in understood):
        return (f"This {platform.name} GPU, {cuda.get_device_name()} (sm_{capability[0]}{capability[1]}), "
                f"cannot run this torch's kernels, built for {', '.join(built)}: choose "
                f"{platform.gpu_steps}, then run the notebook from the top; until then the lessons run "
                "on the CPU.")
    return None


#: An entry of torch.cuda.get_arch_list(): "sm_86" (a cubin), "compute_120" (PTX), "sm_90a"
#: (arch-specific), "sm_100f" (family-specific). The last digit is the minor version.
ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether kernels torch built as `arch` run on a GPU of compute `capability` (major, minor).

    NVIDIA's rule (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility";
    the Blackwell Compatibility Guide for the a and f suffixes):
    - a cubin for sm_X.y runs on sm_X.z for every z >= y, never on another major: torch's sm_86
      runs on an sm_89 L4, its sm_100 on an sm_103 B300, but sm_90 not on sm_100;
    - PTX for compute_X.y is compiled by the driver for any GPU of X.y or newer, newer majors
      included: compute_120 runs on an sm_121, nothing runs on an older GPU;
    - arch-specific code (sm_90a) runs on its own X.y only; family code (sm_100f) on X.z, z >= y.
    Discrete GPUs only: Jetson's integrated ones (sm_53, sm_62, sm_72, sm_87) run only their own.
    """
    match = ARCH.match(arch)
    if match is None:
        raise ValueError(f"{arch!r} is not an entry of torch.cuda.get_arch_list(): expected sm_XY or "
                         "compute_XY, optionally with an a or f suffix (sm_90a, sm_100f)")
    kind, major, minor, suffix = match[1], int(match[2]), int(match[3]), match[4]
    if suffix == "a":
        return capability == (major, minor)
    if kind == "compute" and not suffix:
        return capability >= (major, minor)
    return capability[0] == major and capability[1] >= minor


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
