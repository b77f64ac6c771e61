"""Hosted notebooks: every notebook carries the current bootstrap cell and Colab/Kaggle links, made
from the one repository URL in pyproject.toml (mpcourse.hosted), and the kernelspec JupyterLab
writes; the bootstrap's advice in a mocked Colab without a GPU and in Kaggle without internet
(mpcourse.hosted_session). The notebooks actually installing and running in a bare Python is
tests/hosted/install_checks.py (`make hosted`)."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch
from grading_budgets import program_backstop

from mpcourse import hosted_session
from mpcourse.hosted import (BOOTSTRAP_ID, KERNELSPEC, Repository, bootstrap_source, check_course,
                             course_notebooks, readme_table, repository, stamp_course, stamped)

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
                          env={"MPCOURSE_INSTALL_SOURCE": "/nonexistent.whl", "PATH": ""},
                          timeout=program_backstop())
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")



def test_every_notebook_stores_the_kernel_as_the_installed_ipykernel_writes_it():
    """JupyterLab writes the running kernel's spec, and ipykernel's language_info, into a notebook it
    opens: stored the same, an untouched lesson is not marked unsaved (the Python version apart,
    which is the machine's)."""
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict
    spec = get_kernel_dict()
    assert KERNELSPEC == {"display_name": spec["display_name"], "language": spec["language"],
                          "name": KERNEL_NAME}
    language = {k: v for k, v in IPythonKernel.language_info.items() if k != "version"}
    changed = []
    for path in course_notebooks(ROOT):
        metadata = nbformat.read(path, as_version=4).metadata
        stored = {k: v for k, v in metadata.get("language_info", {}).items() if k != "version"}
        if metadata.get("kernelspec") != KERNELSPEC or (stored and stored != language):
            changed.append(path.relative_to(ROOT).as_posix())
    assert not changed, f"opening these would rewrite their metadata: {changed}; run mpcourse hosted --stamp"


def test_a_released_exercise_keeps_the_kernelspec():
    from mpcourse.grading.judging.release import release_notebook
    solution = nbformat.read(ROOT / "solutions" / "ex01_bf16_rounding.ipynb", as_version=4)
    assert release_notebook(solution, "ex01_bf16_rounding").metadata.kernelspec == KERNELSPEC


def _cuda(available=True, capability=(7, 5), arch=("sm_75", "sm_80", "sm_90"), name="Tesla T4"):
    return SimpleNamespace(is_available=lambda: available, get_device_capability=lambda: capability,
                           get_arch_list=lambda: list(arch), get_device_name=lambda: name)


@pytest.mark.parametrize("environ, platform",
                         [({"COLAB_RELEASE_TAG": "release-colab_1"}, hosted_session.COLAB),
                          ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, hosted_session.KAGGLE)])
def test_the_hosted_platform_is_found_by_its_environment(environ, platform):
    assert hosted_session.hosted_platform(environ) is platform


def test_without_a_gpu_the_advice_says_how_to_switch_and_that_lessons_run_on_the_cpu():
    colab = hosted_session.gpu_advice(hosted_session.COLAB, _cuda(available=False))
    kaggle = hosted_session.gpu_advice(hosted_session.KAGGLE, _cuda(available=False))
    assert "\n" not in colab and "Runtime -> Change runtime type -> T4 GPU" in colab and "on the CPU" in colab
    assert "Settings -> Accelerator -> GPU T4 x2" in kaggle and "Internet on" in kaggle
    assert "on the CPU" in kaggle
    assert hosted_session.gpu_advice(hosted_session.COLAB, _cuda()) is None


def test_a_gpu_this_torch_was_not_built_for_is_named_with_the_switch():
    """Kaggle's P100 (sm_60) under a torch built for sm_75 and newer; a compute_ (PTX) entry at or
    below the GPU's capability would let it run."""
    p100 = _cuda(capability=(6, 0), name="Tesla P100-PCIE-16GB")
    line = hosted_session.gpu_advice(hosted_session.KAGGLE, p100)
    assert "Tesla P100-PCIE-16GB (sm_60)" in line and "sm_75, sm_80, sm_90" in line and "GPU T4 x2" in line
    ptx = _cuda(capability=(6, 0), arch=("compute_60",))
    assert hosted_session.gpu_advice(hosted_session.KAGGLE, ptx) is None


#: torch.cuda.get_arch_list() of the wheels torch 2.10 to 2.14 ship, as torch prints them
#: (sources: the docstring of the first test below).
ARCH_LISTS = {
    "2.10-2.14 cu126": ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"),
    "2.10 cu128": ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
    "2.11 cu128": ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"),
    "cu129": ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"),
    "2.10-2.14 cu130/cu132": ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"),
    "aarch64 cu130": ("sm_80", "sm_90", "sm_100", "sm_110", "sm_120", "compute_120"),
}
BLACKWELL_BUILDS = [label for label in ARCH_LISTS if label != "2.10-2.14 cu126"]


@pytest.mark.parametrize("build", BLACKWELL_BUILDS)
@pytest.mark.parametrize("name, capability", [
    ("NVIDIA L4", (8, 9)), ("NVIDIA GeForce RTX 4090", (8, 9)), ("NVIDIA L40S", (8, 9)),
    ("NVIDIA B300", (10, 3)), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0)),
    ("NVIDIA H100 80GB HBM3", (9, 0))])
def test_a_gpu_the_build_covers_by_a_same_major_cubin_gets_no_advice(build, name, capability):
    """sm_89 runs torch's sm_86 (or, on aarch64, sm_80) cubins, sm_103 its sm_100 ones: no build
    lists sm_89 or sm_103. ARCH_LISTS (Linux x86 wheels unless named), as torch prints them:
    - "2.10 cu128" and "2.10-2.14 cu126": printed in pytorch/pytorch#182250 (torch 2.10.0+cu128,
      2.11.0+cu126), the 12.6 row also in RELEASE.md's support matrix of 2.11 (PR #175253), 2.12
      (PR #182849) and 2.14 (RFC #190355): Maxwell 5.0 ... Hopper 9.0, no PTX;
    - "2.11 cu128": printed in #182250 (2.11.0+cu128), Volta dropped (PR #175253);
    - "cu129": .ci/manywheel/build_cuda.sh's 12.9 case (pytorch/pytorch at 799d09f), "7.0;7.5;8.0;8.6;9.0;10.0;12.0+PTX", which
      torch 2.8.0+cu129 prints with compute_120 last (its "+PTX");
    - "2.10-2.14 cu130 / cu132": build_cuda.sh's 13.0 case on x86, "7.5;8.0;8.6;9.0;10.0;12.0+PTX",
      the 13.0 and 13.2 rows of RELEASE.md for 2.12 (PR #182849) and 2.14 (RFC #190355), and
      torch 2.13's own torch.cuda.PYTORCH_RELEASES_CODE_CC (x86: 75, 80, 86, 90, 100, 120);
    - "aarch64 cu130": build_cuda.sh's 13.0 case on aarch64 (sm_110 added; sm_75 and sm_86 removed).
    """
    cuda = _cuda(capability=capability, arch=ARCH_LISTS[build], name=name)
    assert hosted_session.gpu_advice(hosted_session.COLAB, cuda) is None


@pytest.mark.parametrize("build", ["2.10 cu128", "2.11 cu128", "cu129", "2.10-2.14 cu130/cu132"])
def test_a_p100_is_warned_under_every_build_that_starts_at_sm_70_or_sm_75(build):
    p100 = _cuda(capability=(6, 0), arch=ARCH_LISTS[build], name="Tesla P100-PCIE-16GB")
    line = hosted_session.gpu_advice(hosted_session.KAGGLE, p100)
    assert "Tesla P100-PCIE-16GB (sm_60)" in line and ", ".join(ARCH_LISTS[build]) in line
    assert "GPU T4 x2" in line and "\n" not in line


def test_the_cu126_build_runs_a_p100_and_has_nothing_for_blackwell():
    cu126 = ARCH_LISTS["2.10-2.14 cu126"]
    assert hosted_session.gpu_advice(hosted_session.KAGGLE, _cuda(capability=(6, 0), arch=cu126)) is None
    for capability in ((10, 0), (10, 3), (12, 0)):
        assert "cannot run" in hosted_session.gpu_advice(hosted_session.COLAB,
                                                          _cuda(capability=capability, arch=cu126))


@pytest.mark.parametrize("arch, runs, fails", [
    ("sm_86", [(8, 6), (8, 9)], [(8, 0), (9, 0), (7, 5)]),
    ("sm_100", [(10, 0), (10, 3)], [(12, 0), (9, 0)]),
    ("sm_120", [(12, 0), (12, 1)], [(10, 3), (13, 0)]),
    ("compute_120", [(12, 0), (12, 1), (13, 0)], [(10, 3), (6, 0)]),
    ("compute_60", [(6, 0), (7, 5), (12, 0)], [(5, 2)]),
    ("sm_90a", [(9, 0)], [(10, 0)]),
    ("compute_90a", [(9, 0)], [(10, 0), (12, 0)]),
    ("sm_100f", [(10, 0), (10, 3)], [(12, 0)]),
])
def test_runs_on_follows_nvidias_cubin_and_ptx_rules(arch, runs, fails):
    assert all(hosted_session.runs_on(arch, c) for c in runs)
    assert not any(hosted_session.runs_on(arch, c) for c in fails)


def test_runs_on_agrees_with_torchs_own_table_for_every_discrete_gpu_and_cubin():
    """torch.cuda.DEVICE_REQUIREMENT is torch's record of which device runs which cubin (used for its
    own start-up warning); integrated Jetson GPUs (5.3, 6.2, 7.2, 8.7, 10.1, 11.0) are left out."""
    integrated = {53, 62, 72, 87, 101, 110}
    codes = [cc for cc in torch.cuda.DEVICE_REQUIREMENT if cc not in integrated]
    devices = [cc for cc in codes + [61, 89, 103, 121] if cc not in integrated]
    for code in codes:
        for device in devices:
            expected = torch.cuda._code_compatible_with_device(device, code)
            assert hosted_session.runs_on(f"sm_{code}", divmod(device, 10)) is expected, (code, device)


def test_an_arch_entry_runs_on_cannot_read_is_refused_by_name_and_skipped_by_the_advice():
    with pytest.raises(ValueError, match="'gfx90a' is not an entry of torch.cuda.get_arch_list"):
        hosted_session.runs_on("gfx90a", (9, 0))
    odd = _cuda(capability=(8, 9), arch=("gfx90a", "sm_86"))
    assert hosted_session.gpu_advice(hosted_session.COLAB, odd) is None


def test_pips_resolver_errors_are_summed_up_in_one_line():
    stderr = ("ERROR: pip's dependency resolver does not currently take into account all the packages "
              "that are installed. This behaviour is the source of the following dependency conflicts.\n"
              "tensorflow 2.18.0 requires ml-dtypes<0.5.0,>=0.4.0, but you have ml-dtypes 0.7.0 which is "
              "incompatible.\n"
              "jax 0.4.33 requires ml-dtypes>=0.2.0, but you have ml-dtypes 0.7.0 which is incompatible.\n")
    assert hosted_session.resolver_conflicts(stderr) == [
        "tensorflow 2.18.0 wants ml-dtypes<0.5.0,>=0.4.0 (now 0.7.0)",
        "jax 0.4.33 wants ml-dtypes>=0.2.0 (now 0.7.0)"]


def test_a_package_upgraded_after_this_process_loaded_it_asks_for_a_restart(monkeypatch):
    import importlib.metadata
    installed = [SimpleNamespace(metadata={"Name": "ipywidgets"}, version="8.1.9"),
                 SimpleNamespace(metadata={"Name": "notloaded"}, version="2.0")]
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: installed)
    monkeypatch.setattr(importlib.metadata, "packages_distributions",
                        lambda: {"ipywidgets": ["ipywidgets"], "notloaded": ["notloaded"],
                                 "absent": ["absent"]})
    monkeypatch.setitem(sys.modules, "ipywidgets", SimpleNamespace())
    before = {"ipywidgets": "7.7.1", "notloaded": "1.0"}
    assert hosted_session.upgraded_while_loaded(before) == ["ipywidgets 7.7.1 -> 8.1.9"]


def _run_bootstrap(cwd, env, *python_flags):
    return subprocess.run([sys.executable, *python_flags, "-c", bootstrap_source(REPO)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=program_backstop())


def test_in_a_mocked_colab_without_a_gpu_the_bootstrap_says_how_to_get_one(tmp_path):
    """Colab's working folder, google.colab importable (a stand-in package), no GPU (this machine)."""
    (tmp_path / "google" / "colab").mkdir(parents=True)
    (tmp_path / "google" / "colab" / "__init__.py").write_text("")
    (tmp_path / "content").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLAB_", "KAGGLE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    done = _run_bootstrap(tmp_path / "content", env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and "No GPU in this Colab session" in lines[0], done.stdout
    assert "Runtime -> Change runtime type -> T4 GPU" in lines[0] and "on the CPU" in lines[0]


def test_in_kaggle_without_internet_the_bootstrap_says_the_internet_is_off(tmp_path):
    """Kaggle's working folder and variable, no mpcourse (python -S sees no site-packages), and a
    package index that does not resolve, as Kaggle's DNS without Internet."""
    working = tmp_path / "kaggle" / "working"
    working.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "COLAB_", "PYTHON"))}
    env.update(KAGGLE_KERNEL_RUN_TYPE="Interactive", PIP_CONFIG_FILE=os.devnull, PIP_RETRIES="1",
               PIP_INDEX_URL="https://pypi.invalid/simple", PIP_TIMEOUT="5",
               MPCOURSE_INSTALL_SOURCE="mpcourse-not-reachable")
    done = _run_bootstrap(working, env, "-S")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("RuntimeError: mpcourse could not be installed: this Kaggle notebook's Internet is off. "
                    "Turn on Settings -> Internet, then run this cell again."), done.stderr[-3000:]
