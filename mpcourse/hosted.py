"""Hosted notebooks (Google Colab, Kaggle): the cell that installs `mpcourse` there, and the links.

A learner without a GPU of their own opens a lesson in Colab or Kaggle, where `import mpcourse`
fails: the service has torch and Jupyter but not this course. So every notebook starts its code
with one generated *bootstrap* cell. Where `mpcourse` is importable (`make lab`, the grader's
sandbox, the tests) it does nothing and prints nothing; where it is not, it installs the course's
own version with pip from the repository and says so in one line. On a hosted platform it also
says, in one line each, how to get a GPU and whether the session must restart
(mpcourse/hosted_session.py). The environment variable
`MPCOURSE_INSTALL_SOURCE` replaces that source with anything pip installs (a wheel's path in
the offline test of tests/hosted).

The repository's URL is written in one place, `pyproject.toml`'s `[project.urls] Repository`;
the install source, each notebook's "Open in Colab" and "Open in Kaggle" links and the README's
lesson table are generated from it by `stamp_course` (`mpcourse hosted --stamp`), and
`check_course` (`mpcourse hosted --check`, tests/test_hosted.py) finds every notebook that lacks
the current cell or links.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

#: The branch the links open and the bootstrap installs from: notebook and package stay together.
BRANCH = "main"
SOURCE_VARIABLE = "MPCOURSE_INSTALL_SOURCE"
BOOTSTRAP_ID = "mpcourse-bootstrap"
#: The bootstrap's output is the install's (only where it installs), never what a lesson stored;
#: the website leaves the cell out.
BOOTSTRAP_TAGS = ["nbval-ignore-output", "remove-cell"]
#: The folders whose notebooks are stamped. A solution links to the learner's copy in exercises/
#: (what a learner should open), so that `mpcourse release` copies the right links.
FOLDERS = ("notebooks", "solutions", "exercises")
LINKS_LINE = re.compile(r"^\[Open in Colab\]\(.*$", re.MULTILINE)
#: The kernel as the installed ipykernel names itself (`python -m ipykernel install` writes it), which
#: JupyterLab writes into a notebook when it opens: stored the same, opening a lesson changes nothing.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class Repository:
    """The course's GitHub repository, from which every link and the install source are made."""
    url: str
    branch: str = BRANCH

    @property
    def owner_and_name(self) -> str:
        match = GITHUB.match(self.url)
        if match is None:
            raise ValueError(f"the repository URL must be https://github.com/<owner>/<name> (Colab and "
                             f"Kaggle open notebooks from GitHub), got {self.url!r}")
        return f"{match.group(1)}/{match.group(2)}"

    def colab(self, path: str) -> str:
        """The URL that opens the notebook at `path` (relative to the repository) in Colab."""
        return f"https://colab.research.google.com/github/{self.owner_and_name}/blob/{self.branch}/{path}"

    def kaggle(self, path: str) -> str:
        """The URL that imports the notebook at `path` into a new Kaggle notebook."""
        return (f"https://kaggle.com/kernels/welcome?src=https://github.com/{self.owner_and_name}"
                f"/blob/{self.branch}/{path}")

    def links(self, path: str) -> str:
        """The one markdown line of links that a title cell carries."""
        return f"[Open in Colab]({self.colab(path)}) · [Open in Kaggle]({self.kaggle(path)})"

    @property
    def install_source(self) -> str:
        """What pip installs in a hosted notebook: this repository's package at `branch`."""
        return f"git+https://github.com/{self.owner_and_name}@{self.branch}"


def repository(root: str | Path = ".") -> Repository:
    """The repository named by `[project.urls] Repository` in `root`'s pyproject.toml."""
    path = Path(root) / "pyproject.toml"
    try:
        import tomllib
    except ImportError:  # Python 3.10: read the one line
        match = re.search(r'^Repository\s*=\s*"([^"]+)"', path.read_text(), re.MULTILINE)
        url = match.group(1) if match else None
    else:
        url = tomllib.loads(path.read_text()).get("project", {}).get("urls", {}).get("Repository")
    if not url:
        raise ValueError(f"{path} names no repository: add [project.urls] Repository = "
                         "\"https://github.com/<owner>/<name>\"")
    repo = Repository(url)
    repo.owner_and_name  # validates the URL
    return repo


#: What pip says when it reached no server ("Failed to resolve", git's "Could not resolve host"):
#: Kaggle's "Internet off", where DNS fails.
OFFLINE_SIGNS = ("resolve", "new connection", "unreachable")


def bootstrap_source(repo: Repository) -> str:
    """The bootstrap cell's code (see the module's docstring, and mpcourse.hosted_session for what it
    says in a hosted notebook). pip's output is captured: a failure is explained in one line, and
    resolver errors are summed up by `report_install` instead of printed in red."""
    return f'''# Colab and Kaggle lack this course's package: this cell installs it there (about a minute),
# says so, and says how to get a GPU there. Where mpcourse is installed (`make lab`) it does
# nothing. (Generated by `mpcourse hosted --stamp`.)
import importlib, importlib.metadata, importlib.util, os, subprocess, sys, time
if importlib.util.find_spec("mpcourse") is None:
    _source = os.environ.get("{SOURCE_VARIABLE}", "{repo.install_source}")
    _start, _before = time.monotonic(), {{d.metadata["Name"]: d.version
                                          for d in importlib.metadata.distributions()}}
    _pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", _source],
                          capture_output=True, text=True)
    if _pip.returncode != 0 and "KAGGLE_KERNEL_RUN_TYPE" in os.environ and any(
            sign in _pip.stderr for sign in {OFFLINE_SIGNS!r}):
        raise RuntimeError("mpcourse could not be installed: this Kaggle notebook's Internet is off. "
                           "Turn on Settings -> Internet, then run this cell again.")
    if _pip.returncode != 0:
        raise RuntimeError(f"mpcourse could not be installed from {{_source}}:\\n{{_pip.stderr[-3000:]}}")
    importlib.invalidate_caches()
    from mpcourse.hosted_session import report_install
    report_install(_source, _before, _pip.stderr, time.monotonic() - _start)
from mpcourse.hosted_session import advise
advise()'''


def link_target(relative: str) -> str:
    """The notebook a page's links open: a solution's links open the learner's copy."""
    folder, name = relative.split("/", 1)
    return f"exercises/{name}" if folder == "solutions" else relative


def stamped(nb: nbformat.NotebookNode, relative: str, repo: Repository) -> nbformat.NotebookNode:
    """`nb` (found at `relative`, e.g. "notebooks/00_welcome.ipynb") with the current links in its
    title cell, the current bootstrap cell before its first code cell, and KERNELSPEC; a copy."""
    nb = nbformat.from_dict(nb)
    nb.metadata.kernelspec = dict(KERNELSPEC)
    title = nb.cells[0] if nb.cells else None
    if title is None or title.cell_type != "markdown" or not title.source.startswith("# "):
        raise ValueError(f"{relative}: the first cell must be the markdown title ('# ...') that carries the links")
    title.source = _with_links(title.source, repo.links(link_target(relative)))
    existing = [c for c in nb.cells if c.get("id") == BOOTSTRAP_ID]
    if existing:
        cell = existing[0]
        nb.cells.remove(cell)
    else:
        cell = nbformat.v4.new_code_cell(id=BOOTSTRAP_ID)
        _make_room_for_first_count(nb)
    cell.source = bootstrap_source(repo)
    cell.metadata = {"tags": list(BOOTSTRAP_TAGS)}
    cell.outputs = []
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    cell.execution_count = 1 if _executed(nb) else None
    nb.cells.insert(first_code, cell)
    return nb


def _with_links(source: str, links: str) -> str:
    if LINKS_LINE.search(source):
        return LINKS_LINE.sub(lambda _: links, source, count=1)
    heading, _, rest = source.partition("\n")
    return f"{heading}\n\n{links}\n\n{rest.lstrip(chr(10))}".rstrip("\n")


def _executed(nb) -> bool:
    return any(c.cell_type == "code" and c.get("execution_count") for c in nb.cells)


def _make_room_for_first_count(nb) -> None:
    """An executed notebook's counts run 1, 2, ...: a new first cell takes 1 and the others move up,
    as if the notebook had run with it (the bootstrap prints nothing where mpcourse is installed)."""
    for c in nb.cells:
        if c.cell_type == "code" and c.get("execution_count"):
            c.execution_count += 1
            for output in c.outputs:
                if output.get("execution_count"):
                    output.execution_count += 1


def course_notebooks(root: str | Path = ".") -> list[Path]:
    """Every notebook the course ships: lessons, solutions and exercises."""
    root = Path(root)
    return [p for folder in FOLDERS for p in sorted((root / folder).glob("*.ipynb"))]


def readme_table(readme: str, repo: Repository) -> str:
    """README's lesson table (under '## The lessons') with an 'open in' column of links per lesson."""
    lines = readme.split("\n")
    try:
        start = lines.index("## The lessons")
    except ValueError:
        raise ValueError("README.md has no '## The lessons' section to put the links in") from None
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("| #"))
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    has_links = "open in" in columns
    if not has_links:
        lines[header] = "| # | notebook | open in | " + " | ".join(columns[2:]) + " |"
        lines[header + 1] = "|---" * (len(columns) + 1) + "|"
    row = header + 2
    while row < len(lines) and lines[row].startswith("| "):
        cells = [c.strip() for c in lines[row].strip().strip("|").split("|")]
        name = re.search(r"(\d\d_[A-Za-z0-9_]+\.ipynb)", cells[1]).group(1)
        path = f"notebooks/{name}"
        opened = f"[Colab]({repo.colab(path)}) · [Kaggle]({repo.kaggle(path)})"
        rest = cells[3:] if has_links else cells[2:]
        lines[row] = f"| {cells[0]} | [`{name}`]({path}) | {opened} | " + " | ".join(rest) + " |"
        row += 1
    return "\n".join(lines)


def stamp_course(root: str | Path = ".") -> list[Path]:
    """Stamp every notebook and the README in place; return the files that changed."""
    root = Path(root)
    repo, changed = repository(root), []
    for path in course_notebooks(root):
        text = path.read_text()
        nb = stamped(nbformat.reads(text, as_version=4), path.relative_to(root).as_posix(), repo)
        new = nbformat.writes(nb) + "\n"
        if new != text:
            path.write_text(new)
            changed.append(path)
    readme = root / "README.md"
    text = readme.read_text()
    new = readme_table(text, repo)
    if new != text:
        readme.write_text(new)
        changed.append(readme)
    return changed


def check_course(root: str | Path = ".") -> list[str]:
    """One line per notebook (or README) that lacks the current bootstrap cell, links or kernelspec."""
    root = Path(root)
    repo, problems = repository(root), []
    for path in course_notebooks(root):
        relative = path.relative_to(root).as_posix()
        nb = nbformat.read(path, as_version=4)
        codes = [c for c in nb.cells if c.cell_type == "code"]
        if not codes or codes[0].get("id") != BOOTSTRAP_ID or codes[0].source != bootstrap_source(repo) \
                or codes[0].metadata.get("tags") != BOOTSTRAP_TAGS:
            problems.append(f"{relative}: its first code cell is not the current bootstrap cell")
        if nb.metadata.get("kernelspec") != KERNELSPEC:
            problems.append(f"{relative}: its kernelspec is not ipykernel's, so opening it would change it")
        if not nb.cells or repo.links(link_target(relative)) not in nb.cells[0].source.split("\n"):
            problems.append(f"{relative}: its title cell lacks the current Colab and Kaggle links")
    readme = (root / "README.md").read_text()
    if readme_table(readme, repo) != readme:
        problems.append("README.md: the lesson table lacks the current Colab and Kaggle links")
    if problems:
        problems.append("run `mpcourse hosted --stamp` in the repository's root")
    return problems
