"""Every edge of the `mpcourse` command: a bad value is refused with exit status 2 and ONE line on
stderr naming the value and what is allowed, before any work (no training, grading, release or
autograder build starts).

The rows run in this process through `mpcourse.cli.main`, on a faked CPU (no CUDA, no timing), so
the table takes seconds. `{tmp}` in a row is a folder of bad files made once (see `bad_files`);
`{root}` is the course's checkout.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import torch

from mpcourse import cli
from mpcourse.machine import hardware

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--batch", "2", "--seq-len", "8",
        "--device", "cpu"]
GRADEBOOK_COLUMNS = "path,exercise,test,points,max_points,passed,score,max_score\n"

ROWS = [
    # train: sizes, numbers, device, warm-up
    (["train", "--steps", "0"], "argument --steps: 0 is too small (allowed: 1 or more)"),
    (["train", "--steps", "two"], "argument --steps: 'two' is not a whole number"),
    (["train", "--lr", "-1"], "argument --lr: -1 is not positive (allowed: a finite number above 0)"),
    (["train", "--lr", "nan"], "argument --lr: nan is not finite"),
    (["train", "--d-model", "0"], "argument --d-model: 0 is too small"),
    (["train", "--d-model", "60", "--heads", "7", "--device", "cpu"],
     "d_model=60 must be divisible by n_heads=7"),
    (["train", "--seed", "-1"], "argument --seed: -1 is too small (allowed: 0 or more)"),
    (["train", "--threads", "0"], "argument --threads: 0 is too small"),
    (["train", "--nproc", "0"], "argument --nproc: 0 is too small"),
    (["train", "--precision", "fp64"], "argument --precision: invalid choice: 'fp64'"),
    (["train", "--device", "tpu"], "argument --device: unknown device 'tpu' (allowed: auto, cpu, cuda"),
    (["train", "--device", "cuda"], "device 'cuda' is not available here"),
    (["train", "--steps", "3", "--warmup-steps", "3"],
     "--warmup-steps 3 leaves no step to time (allowed: 0 to"),
    (["train", "--warmup-steps", "-1"], "argument --warmup-steps: -1 is too small (allowed: 0 or more)"),
    # train: the checkpoint's path, and what a file to resume from is
    (["train", "--checkpoint", "{tmp}/missing/run.pt"],
     "missing' does not exist (allowed: a file path in an existing"),
    (["train", "--checkpoint", "{tmp}"], "argument --checkpoint: '{tmp}' is a folder"),
    (["train", "--resume", "--checkpoint", "{tmp}/none.pt"], "no checkpoint to resume from at {tmp}/none.pt"),
    (["train", "--resume", "--checkpoint", "{tmp}/text.pt"], "{tmp}/text.pt is not a torch file"),
    (["train", "--resume", "--checkpoint", "{tmp}/list.pt"], "{tmp}/list.pt is a torch file holding a list"),
    (["train", "--resume", "--checkpoint", "{tmp}/dict.pt"],
     "{tmp}/dict.pt is a torch file but not a checkpoint of `mpcourse train`: it lacks step, model"),
    (["train", "--resume", "--checkpoint", "{tmp}/run.pt", "--steps", "3", "--lr", "0.5", *TINY],
     "was saved by a different configuration: lr=0.01 there, 0.5 here"),
    # compare
    (["compare", "--precisions", "fp32,fp64"],
     "argument --precisions: unknown precision 'fp64' (allowed: fp32"),
    (["compare", "--time-limit", "-5"], "argument --time-limit: -5 is negative"),
    (["compare", "--out", "{tmp}/curves.txt"], "'{tmp}/curves.txt' does not end in .png"),
    (["compare", "--out", "{tmp}/missing/curves.png"], "missing' does not exist"),
    # doctor, hosted
    (["doctor", "--verbose"], "unrecognized arguments: --verbose"),
    (["hosted", "--root", "{tmp}/missing"], "the folder '{tmp}/missing' does not exist"),
    (["hosted", "--root", "{tmp}"], "'{tmp}' holds no pyproject.toml"),
    # release
    (["release", "--solutions", "/nonexistent"],
     "argument --solutions: the folder '/nonexistent' does not exist"),
    (["release", "--solutions", "{tmp}/empty"], "no solution notebooks (ex*.ipynb) in '{tmp}/empty'"),
    (["release", "--solutions", "{root}/solutions", "--exercises", "{tmp}/text.pt"],
     "'{tmp}/text.pt' is a file"),
    # grade
    (["grade", "{tmp}/missing.ipynb"], "argument PATH: no file '{tmp}/missing.ipynb'"),
    (["grade", "--timeout", "0", "{tmp}/ex00_bytes.ipynb"], "argument --timeout: 0 is not positive"),
    (["grade", "--timeout", "inf", "{tmp}/ex00_bytes.ipynb"], "argument --timeout: inf is not finite"),
    (["grade", "--jobs", "0", "{tmp}/ex00_bytes.ipynb"], "argument --jobs: 0 is too small"),
    (["grade", "--csv", "{tmp}", "{tmp}/ex00_bytes.ipynb"], "argument --csv: '{tmp}' is a folder"),
    (["grade", "--csv", "{tmp}/text.pt/g.csv", "{tmp}/ex00_bytes.ipynb"],
     "lies under '{tmp}/text.pt', which is a file"),
    (["grade", "--lms", "canva", "{tmp}/ex00_bytes.ipynb"],
     "argument --lms: must be among canvas, moodle, blackboard"),
    (["grade", "--lms", "canvas", "{tmp}/ex00_bytes.ipynb"],
     "--lms writes its gradebook beside the --csv one"),
    (["grade", "--solutions", "{tmp}/empty", "{tmp}/ex00_bytes.ipynb"],
     "no solution notebooks (ex*.ipynb) in"),
    # gradebook export
    (["gradebook", "export", "{tmp}/gradebook.csv", "--lms", "canvas", "--assignment-id", "ex00_bytes"],
     "argument --assignment-id: 'ex00_bytes' is not EXERCISE=ID"),
    (["gradebook", "export", "{tmp}/gradebook.csv", "--lms", "canvas", "--assignment-id", "ex00_bytes=abc"],
     "'ex00_bytes=abc' is not EXERCISE=ID"),
    (["gradebook", "export", "{tmp}/missing.csv", "--lms", "canvas"], "no file '{tmp}/missing.csv'"),
    (["gradebook", "export", "{tmp}/not_a_gradebook.csv", "--lms", "canvas"],
     "'{tmp}/not_a_gradebook.csv' is not a gradebook of `mpcourse grade --csv`: it lacks the column(s)"),
    (["gradebook", "export", "{tmp}/gradebook.csv", "--lms", "canva"],
     "must be among canvas, moodle, blackboard"),
    # collect
    (["collect", "{tmp}/missing.zip", "--from", "canvas"], "'{tmp}/missing.zip' does not exist"),
    (["collect", "{tmp}/text.pt", "--from", "canvas"], "'{tmp}/text.pt' is not a zip file"),
    (["collect", "{tmp}/download.zip", "--from", "blackboard"],
     "argument --from: invalid choice: 'blackboard'"),
    (["collect", "{tmp}/download.zip", "--from", "moodle", "--roster", "{tmp}/missing.csv"],
     "argument --roster: no file '{tmp}/missing.csv'"),
    (["collect", "{tmp}/download.zip", "--from", "canvas", "--out", "{tmp}/text.pt"],
     "'{tmp}/text.pt' is a file"),
    # feedback, report
    (["feedback", "{tmp}/binary.csv", "--out", "{tmp}/feedback"],
     "is not a gradebook of `mpcourse grade --csv`: it "
                                                                  "is not UTF-8 text"),
    (["feedback", "{tmp}/gradebook.csv", "--out", "{tmp}/text.pt"],
     "argument --out: '{tmp}/text.pt' is a file"),
    (["feedback", "{tmp}/gradebook.csv", "--solutions", "{tmp}/missing"],
     "the folder '{tmp}/missing' does not exist"),
    (["report", "{tmp}/missing.csv"], "argument gradebook: no file '{tmp}/missing.csv'"),
    (["report", "{tmp}/bad_number.csv", "--out", "{tmp}/r.html"],
     "line 2: could not convert string to float: 'x'"),
    (["report", "{tmp}/gradebook.csv", "--out", "{tmp}"], "argument --out: '{tmp}' is a folder"),
    # autograder
    (["autograder", "gradescope", "--all", "--solutions", "{root}/solutions", "--out", "{tmp}/a.tar"],
     "'{tmp}/a.tar' does not end in .zip"),
    (["autograder", "gradescope", "--all", "--solutions", "{root}/solutions", "--out", "{tmp}/a.zip",
      "--timeout", "0"],
     "argument --timeout: 0 is not positive"),
    (["autograder", "gradescope", "--all", "--solutions", "{root}/solutions", "--out", "{tmp}/a.zip",
      "--total-seconds", "nan"], "argument --total-seconds: nan is not finite"),
    (["autograder", "gradescope", "--solutions", "{root}/solutions", "--out", "{tmp}/a.zip"],
     "name the exercises to grade (e.g. ex00_bytes), or pass --all; not both"),
    (["autograder", "github-classroom", "--timeout-minutes", "0"],
     "argument --timeout-minutes: 0 is too small"),
    (["autograder", "github-classroom", "--out", "{tmp}/text.pt"],
     "argument --out: '{tmp}/text.pt' is a file"),
]


def _fake_cpu(monkeypatch) -> None:
    """An AVX2 CPU without CUDA or MPS whose calibration is given: no timing, the lab's small size."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.setattr(hardware, "measured_probe",
                        lambda: hardware.MatmulProbe(256, {"fp32": 1e-3, "bf16": 1e-1, "fp16": 1e-1}))


@pytest.fixture(autouse=True)
def fake_cpu(monkeypatch):
    _fake_cpu(monkeypatch)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> Path:
    """A folder of files that are not what an argument needs, and a real checkpoint (run.pt) of a
    3-step tiny run, for resuming under another configuration."""
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "empty").mkdir()
    (tmp / "text.pt").write_text("not a checkpoint\n")
    torch.save([1, 2, 3], tmp / "list.pt")
    torch.save({"config": {}}, tmp / "dict.pt")
    (tmp / "ex00_bytes.ipynb").write_text("{}")
    (tmp / "gradebook.csv").write_text(GRADEBOOK_COLUMNS)
    (tmp / "not_a_gradebook.csv").write_text("a,b\n1,2\n")
    (tmp / "binary.csv").write_bytes(b"\x00\xff\xfe\xfd")
    (tmp / "bad_number.csv").write_text(GRADEBOOK_COLUMNS + "a.ipynb,ex00_bytes,t,x,1,True,1,1\n")
    with zipfile.ZipFile(tmp / "download.zip", "w") as zf:
        zf.writestr("1001_ex00_bytes.ipynb", "{}")
    with pytest.MonkeyPatch.context() as patch:
        _fake_cpu(patch)
        assert cli.main(["train", "--steps", "3", "--checkpoint", str(tmp / "run.pt"), *TINY]) == 0
    return tmp


@pytest.fixture
def no_work(monkeypatch):
    """Each command's work, made to fail the test if a refused command line reaches it."""
    import mpcourse.train
    from mpcourse.grading.instructor import class_run, collect
    from mpcourse.grading.judging import release
    from mpcourse.grading.platforms import classroom, gradescope_zip

    def started(*args, **kwargs):
        raise AssertionError("the command started its work before refusing its arguments")
    for module, name in ((mpcourse.train, "train"), (class_run, "grade_command"), (release, "release_all"),
                         (collect, "collect"), (gradescope_zip, "build_autograder"),
                         (classroom, "write_classroom")):
        monkeypatch.setattr(module, name, started)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.err


@pytest.mark.parametrize("argv, fragment", ROWS, ids=[" ".join(argv)[:60] for argv, _ in ROWS])
def test_a_bad_command_line_is_refused_in_one_line(argv, fragment, bad_files, no_work, capsys, monkeypatch):
    monkeypatch.chdir(bad_files)
    fill = {"tmp": str(bad_files), "root": str(ROOT)}
    status, err = _run([word.format(**fill) for word in argv], capsys)
    assert status == 2, err
    assert err.count("\n") == 1 and err.endswith("\n"), f"one line on stderr, got {err!r}"
    assert err.startswith("mpcourse"), err
    assert fragment.format(**fill) in err, err


def test_the_table_covers_every_subcommand():
    """A new subcommand needs its rows here: each command of the parser appears in the table."""
    parser = cli.build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    assert commands - {argv[0] for argv, _ in ROWS} == set()


def test_an_output_folder_the_user_cannot_write_in_is_refused(bad_files, no_work, capsys, monkeypatch):
    """Write permission comes from the system's own check (root may write anywhere, so the check
    is denied here for one folder, as it is for a learner's account in a read-only folder)."""
    locked = bad_files / "locked"
    locked.mkdir(exist_ok=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: (Path(path) != locked or not mode & os.W_OK)
                        and real_access(path, mode))
    status, err = _run(["report", str(bad_files / "gradebook.csv"), "--out", str(locked / "r.html")], capsys)
    assert status == 2 and err.count("\n") == 1
    assert f"cannot write in '{locked}' to make '{locked / 'r.html'}'" in err, err


def test_short_runs_train_their_steps(bad_files, capsys, monkeypatch):
    """--steps 1 and 2, shorter than the lab's warm-up of 2, run (the warm-up is cut to leave one
    timed step), and so does an explicit --warmup-steps below --steps."""
    monkeypatch.chdir(bad_files)
    for extra in (["--steps", "1"], ["--steps", "2"], ["--steps", "2", "--warmup-steps", "1"]):
        assert cli.main(["train", *extra, "--checkpoint", "short.pt", *TINY]) == 0, capsys.readouterr().err
        steps = int(extra[1])
        assert f"{steps}/{steps}" in capsys.readouterr().out
        assert torch.load("short.pt", weights_only=False)["step"] == steps
