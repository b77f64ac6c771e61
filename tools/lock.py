"""Write requirements-lock.txt and environment.yml's pins from pyproject.toml's ranges (`make lock`).

The lock holds the exact version and the hashes of every Python package that `make lab` and
`make test` install, for every platform and Python the course supports (a universal resolution
by uv, with environment markers where they differ), so that an instructor who runs `make test`
next term installs the set that passed. It leaves out torch and the CUDA runtime that only
PyPI's Linux build of torch pulls in: `TORCH_SPEC` chooses those. torch's own pure-Python
dependencies (sympy, networkx, ...) are locked, resolved against the torch that CI pins.

requirements-lab.txt is the part of the lock that `make lab` installs: the lines of the packages
that the runtime dependencies and the `lab` extra need, found through the lock's own "# via"
annotations, so that a learner's .venv holds no test or website tools. `make test` installs the
whole lock over it. Both come from one resolution, so a package has one version in both.

environment.yml, for conda users, gets the same pins without hashes (conda hands its pip
section to pip in one call with `-e .`, and pip refuses hashes beside an editable install).

Usage: python tools/lock.py --uv PATH_TO_UV --torch 2.13.0   (write the lock)
       python tools/lock.py --compare                       (what this environment has else)
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the lock installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-lock.txt"
LAB_LOCK = ROOT / "requirements-lab.txt"
#: The optional-dependency groups that `make lab` installs beside the runtime dependencies.
LAB_EXTRAS = ("lab",)
ENVIRONMENT = ROOT / "environment.yml"
OLDEST_PYTHON = "3.10"  # pyproject's requires-python
#: Packages that come only with PyPI's CUDA build of torch; TORCH_SPEC decides whether you get them.
CUDA_RUNTIME = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
ENV_BEGIN = "      # BEGIN LOCKED PINS (make lock writes these from requirements-lock.txt)"
ENV_END = "      # END LOCKED PINS"


def extras() -> list[str]:
    """Every optional-dependency group of pyproject.toml: the lock covers them all."""
    return sorted(project_table().get("optional-dependencies", {}))


def compile_lock(uv: str, torch_version: str, hashes: bool, exclude=()) -> str:
    """uv's universal resolution of pyproject.toml with every extra, torch pinned."""
    override = ROOT / "build" / "lock-torch.txt"
    override.parent.mkdir(exist_ok=True)
    override.write_text(f"torch=={torch_version}\n")
    command = [uv, "pip", "compile", "pyproject.toml", "--universal", "--python-version",
               OLDEST_PYTHON, "--override", str(override), "--quiet", "--no-header",
               "--custom-compile-command", "make lock"]
    for extra in extras():
        command += ["--extra", extra]
    if hashes:
        command.append("--generate-hashes")
    for name in exclude:
        command += ["--no-emit-package", name]
    return subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def pins(lock_text: str) -> list[tuple[str, str, str]]:
    """(name, version, marker) for each package of a lock, in its order; marker '' if none."""
    found = []
    for line in lock_text.splitlines():
        match = PIN.match(line)
        if match:
            found.append((match[1].lower(), match[2], (match[3] or "").strip()))
    return found


def blocks(lock_text: str) -> list[tuple[str, str, set[str]]]:
    """(name, the block's lines, the packages it is "# via") for each pin of a lock, in its order.

    A block is a pin's line, its hashes and uv's annotation of what requires it, which is one
    line (`# via furo`) or a list (`# via` then `#   httpx`, ...); `mpcourse (pyproject.toml)`
    marks a requirement of pyproject.toml itself.
    """
    found: list[tuple[str, list[str], set[str]]] = []
    for line in lock_text.splitlines():
        match = PIN.match(line)
        if match:
            found.append((normalize(match[1]), [line], set()))
        elif found and line.startswith("    "):
            found[-1][1].append(line)
            comment = line.strip().removeprefix("#").strip()
            if line.lstrip().startswith("#") and comment != "via":
                found[-1][2].add(normalize(comment.removeprefix("via ").split(" ")[0]))
    return [(name, "\n".join(lines), via) for name, lines, via in found]


def lab_lock(lock_text: str, project: dict) -> str:
    """The part of a lock that the runtime dependencies and LAB_EXTRAS need (requirements-lab.txt):
    every package they name, and every package that one of those requires, transitively."""
    extras = project["optional-dependencies"]
    roots = project["dependencies"] + [r for extra in LAB_EXTRAS for r in extras[extra]]
    needed = {normalize(re.match(r"[A-Za-z0-9._-]+", r)[0]) for r in roots}
    found = blocks(lock_text)
    while True:
        more = {name for name, _, via in found if name not in needed and via & needed}
        if not more:
            break
        needed |= more
    header = ("# The part of requirements-lock.txt that `make lab` installs: the packages the runtime\n"
              f"# dependencies and the {', '.join(LAB_EXTRAS)} extra need, with the lock's versions and\n"
              "# hashes. Written by `make lock` (tools/lock.py): never edit by hand.\n")
    return header + "\n".join(block for name, block, _ in found if name in needed) + "\n"


def project_table() -> dict:
    """pyproject.toml's [project] table."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def locked_here(lock_text: str) -> dict[str, str]:
    """The lock's pins that apply to this interpreter and platform (markers evaluated)."""
    from packaging.markers import Marker
    return {name: version for name, version, marker in pins(lock_text)
            if not marker or Marker(marker).evaluate()}


def installed() -> dict[str, str]:
    """Every distribution installed here, by normalized name."""
    return {normalize(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def compare() -> int:
    """Print each package whose installed version is not the locked one (make test-latest)."""
    from packaging.version import Version
    text = LOCK.read_text()
    lock, have = locked_here(text), installed()
    torch = re.search(r"resolved with torch==(\S+?):", text)
    if torch:  # TORCH_SPEC's, not the lock's; listed, since it changes more than any other
        lock["torch"] = torch[1]
    if "torch" in have and Version(have["torch"]).public == lock.get("torch"):
        have["torch"] = lock["torch"]   # 2.13.0+cpu is the locked 2.13.0, built for the CPU
    changed = [(name, lock.get(name, "-"), have.get(name, "-")) for name in sorted(set(lock) | set(have))
               if lock.get(name) != have.get(name) and name not in ("mpcourse", "pip")
               and (name == "torch" or not CUDA_RUNTIME.match(name))]
    print(f"Installed against {LOCK.name}: {len(changed)} differ" + (":" if changed else ""))
    for name, locked, now in changed:
        print(f"  {name:<28} locked {locked:<14} here {now}")
    return 0


def environment_yml(lock_text: str, torch_version: str) -> str:
    """environment.yml with its pinned section rewritten from the lock."""
    lines = [f"      - torch=={torch_version}"]
    lines += [f"      - {name}=={version}" + (f" ; {marker}" if marker else "")
              for name, version, marker in pins(lock_text)]
    text = ENVIRONMENT.read_text()
    start, end = text.index(ENV_BEGIN) + len(ENV_BEGIN), text.index(ENV_END)
    return text[:start] + "\n" + "\n".join(lines) + "\n" + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uv", help="the uv executable")
    parser.add_argument("--torch", help="the torch version CI installs, e.g. 2.13.0")
    parser.add_argument("--compare", action="store_true",
                        help="print what this environment has other than the lock, and stop")
    args = parser.parse_args()
    if args.compare:
        return compare()
    if not (args.uv and args.torch):
        parser.error("writing the lock needs --uv and --torch")
    first = compile_lock(args.uv, args.torch, hashes=False)
    cuda = sorted({name for name, _, _ in pins(first) if CUDA_RUNTIME.match(name)})
    lock = compile_lock(args.uv, args.torch, hashes=True, exclude=cuda)
    header = ("# The exact versions (and hashes) of every Python package `make lab` and `make test`\n"
              "# install, torch apart (TORCH_SPEC chooses it). Written by `make lock` from\n"
              f"# pyproject.toml's ranges, resolved with torch=={args.torch}: never edit by hand.\n")
    LOCK.write_text(header + lock)
    LAB_LOCK.write_text(lab_lock(header + lock, project_table()))
    ENVIRONMENT.write_text(environment_yml(lock, args.torch))
    print(f"{LOCK.name}: {len(pins(lock))} pins ({LAB_LOCK.name}: {len(pins(LAB_LOCK.read_text()))} of "
          f"them); left to TORCH_SPEC: {', '.join(cuda)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
