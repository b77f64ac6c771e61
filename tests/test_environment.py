"""The conda environment installs everything pyproject.toml asks for."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement.strip(), maxsplit=1)[0].lower()


def test_every_dependency_is_in_environment_yml():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = {_name(r) for r in pyproject["project"]["dependencies"]}
    listed = {_name(line.strip()[2:]) for line in (ROOT / "environment.yml").read_text().splitlines()
              if line.strip().startswith("- ") and not line.strip().startswith("- -e")}
    missing = wanted - listed
    assert not missing, f"environment.yml lacks these pyproject.toml dependencies: {sorted(missing)}"


def test_environment_installs_the_package_itself():
    assert "- -e .[dev]" in (ROOT / "environment.yml").read_text()
