"""Hosted notebooks: every notebook carries the current bootstrap cell and Colab/Kaggle links, made
from the one repository URL in pyproject.toml (mpcourse.hosted). The notebooks actually
installing and running in a bare Python is tests/hosted/install_checks.py (`make hosted`)."""
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mpcourse.hosted import (BOOTSTRAP_ID, Repository, bootstrap_source, check_course, readme_table,
                             repository, stamp_course, stamped)

ROOT = Path(__file__).resolve().parents[1]
REPO = Repository("https://github.com/someone/a-course")


def test_every_notebook_and_the_readme_carry_the_current_cell_and_links():
    problems = check_course(ROOT)
    assert not problems, "\n".join(problems)


def test_the_repository_comes_from_pyproject_and_makes_every_url():
    repo = repository(ROOT)
    text = (ROOT / "pyproject.toml").read_text()
    assert f'Repository = "{repo.url}"' in text
    owner_and_name = repo.url.removeprefix("https://github.com/")
    assert repo.colab("notebooks/00_welcome.ipynb") == \
        f"https://colab.research.google.com/github/{owner_and_name}/blob/main/notebooks/00_welcome.ipynb"
    assert repo.kaggle("notebooks/00_welcome.ipynb") == ("https://kaggle.com/kernels/welcome?src=https://github.com/"
                                                         f"{owner_and_name}/blob/main/notebooks/00_welcome.ipynb")
    assert repo.install_source == f"git+https://github.com/{owner_and_name}@main"


@pytest.mark.parametrize("url", ["https://gitlab.com/a/b", "github.com/a/b", "https://github.com/a",
                                 "https://github.com/a/b/c"])
def test_a_repository_colab_cannot_open_is_refused_by_name(url):
    with pytest.raises(ValueError, match="https://github.com/<owner>/<name>") as error:
        Repository(url).colab("notebooks/x.ipynb")
    assert repr(url) in str(error.value)


def _lesson(executed=True):
    title = nbformat.v4.new_markdown_cell("# Lesson 99: A title\n\nThe first paragraph.")
    intro = nbformat.v4.new_markdown_cell("## Learning objectives")
    first = nbformat.v4.new_code_cell("x = 1\nx", execution_count=1 if executed else None,
                                      outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "1"},
                                                                      execution_count=1)] if executed else [])
    second = nbformat.v4.new_code_cell("print(x)", execution_count=2 if executed else None)
    return nbformat.v4.new_notebook(cells=[title, intro, first, second])


def test_stamping_puts_the_links_under_the_title_and_the_bootstrap_before_the_first_code():
    nb = stamped(_lesson(), "notebooks/99_x.ipynb", REPO)
    assert nb.cells[0].source.splitlines()[0] == "# Lesson 99: A title"
    assert REPO.links("notebooks/99_x.ipynb") in nb.cells[0].source.splitlines()
    assert "The first paragraph." in nb.cells[0].source
    assert [c.cell_type for c in nb.cells] == ["markdown", "markdown", "code", "code", "code"]
    boot = nb.cells[2]
    assert boot.id == BOOTSTRAP_ID and boot.source == bootstrap_source(REPO)
    assert "nbval-ignore-output" in boot.metadata["tags"]
    # executed in order as if it had run with the bootstrap first: counts and results move up by one
    assert [c.execution_count for c in nb.cells[2:]] == [1, 2, 3]
    assert nb.cells[3].outputs[0].execution_count == 2
    nbformat.validate(nb)


def test_stamping_twice_changes_nothing_and_a_new_url_replaces_the_old_one():
    once = stamped(_lesson(), "notebooks/99_x.ipynb", REPO)
    assert nbformat.writes(stamped(once, "notebooks/99_x.ipynb", REPO)) == nbformat.writes(once)
    moved = Repository("https://github.com/fork/elsewhere")
    again = stamped(once, "notebooks/99_x.ipynb", moved)
    assert "someone/a-course" not in nbformat.writes(again)
    assert sum(c.id == BOOTSTRAP_ID for c in again.cells) == 1
    assert [c.execution_count for c in again.cells if c.cell_type == "code"] == [1, 2, 3]


def test_an_unexecuted_exercise_gets_an_unexecuted_bootstrap_and_a_solution_links_its_exercise():
    nb = stamped(_lesson(executed=False), "solutions/ex99_x.ipynb", REPO)
    assert [c.execution_count for c in nb.cells if c.cell_type == "code"] == [None, None, None]
    assert REPO.colab("exercises/ex99_x.ipynb") in nb.cells[0].source


def test_a_notebook_without_a_title_cell_is_refused():
    nb = _lesson()
    nb.cells.pop(0)
    with pytest.raises(ValueError, match="notebooks/99_x.ipynb: the first cell must be the markdown title"):
        stamped(nb, "notebooks/99_x.ipynb", REPO)


def test_the_readme_table_gets_one_column_of_links_per_lesson_once():
    readme = ("# Course\n\n## The lessons\n\n| # | notebook | what you learn |\n|---|---|---|\n"
              "| 00 | `00_welcome.ipynb` | the map |\n| 01 | `01_formats.ipynb` | bits |\n\nAfter.\n")
    table = readme_table(readme, REPO)
    assert "| # | notebook | open in | what you learn |" in table
    assert (f"| 01 | [`01_formats.ipynb`](notebooks/01_formats.ipynb) | [Colab]({REPO.colab('notebooks/01_formats.ipynb')})"
            f" · [Kaggle]({REPO.kaggle('notebooks/01_formats.ipynb')}) | bits |") in table
    assert readme_table(table, REPO) == table
    assert table.endswith("\n\nAfter.\n")


def test_check_names_each_stale_notebook_and_stamp_fixes_all(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project.urls]\nRepository = "https://github.com/someone/a-course"\n')
    (tmp_path / "README.md").write_text("## The lessons\n\n| # | notebook | what |\n|---|---|---|\n"
                                        "| 99 | `99_x.ipynb` | it |\n")
    for folder, name in (("notebooks", "99_x"), ("solutions", "ex99_x"), ("exercises", "ex99_x")):
        (tmp_path / folder).mkdir()
        nbformat.write(_lesson(executed=folder == "notebooks"), tmp_path / folder / f"{name}.ipynb")
    problems = check_course(tmp_path)
    assert "notebooks/99_x.ipynb: its first code cell is not the current bootstrap cell" in problems
    assert "exercises/ex99_x.ipynb: its title cell lacks the current Colab and Kaggle links" in problems
    assert any(p.startswith("README.md") for p in problems)
    assert len(stamp_course(tmp_path)) == 4
    assert check_course(tmp_path) == [] and stamp_course(tmp_path) == []


def test_the_bootstrap_is_silent_where_mpcourse_is_installed():
    done = subprocess.run([sys.executable, "-c", bootstrap_source(REPO)], capture_output=True, text=True,
                          env={"MPCOURSE_INSTALL_SOURCE": "/nonexistent.whl", "PATH": ""}, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

