"""The grading tests' plan cache (tests/cached_plans.py): a plan is reused only for the same
solution, the same course code and the same torch, and a failed plan is never kept."""
import dataclasses
from pathlib import Path

import torch

import cached_plans
from mpcourse.grading.judging.exercise import load_exercise
from mpcourse.grading.judging.judge import Plan

ROOT = Path(__file__).resolve().parents[1]


def _counting_planner(made: list):
    def plan_exercises(exercises, keys, jobs, options):
        made.extend(sorted(keys))
        return {key: Plan([f"{key} planned"]) if key != "ex01" else "RuntimeError: could not run"
                for key in keys}
    return plan_exercises


def test_a_plan_is_made_once_per_solution_and_a_failed_one_again(tmp_path):
    ex00 = load_exercise(ROOT / "solutions" / "ex00_bytes.ipynb")
    ex01 = load_exercise(ROOT / "solutions" / "ex01_bf16_rounding.ipynb")
    made = []
    plan = cached_plans.cached(_counting_planner(made), tmp_path)
    first = plan({"ex00": ex00, "ex01": ex01}, ["ex00", "ex01"], 1, None)
    again = plan({"ex00": ex00, "ex01": ex01}, ["ex00", "ex01"], 1, None)
    assert first == again == {"ex00": Plan(["ex00 planned"]), "ex01": "RuntimeError: could not run"}
    assert made == ["ex00", "ex01", "ex01"]  # the failed plan is not kept
    edited = dataclasses.replace(ex00, code_cells=ex00.code_cells + ("x = 1",))
    plan({"ex00": edited}, ["ex00"], 1, None)
    assert made[-1] == "ex00", "a changed solution reused the old solution's plan"


def test_the_key_holds_the_solution_the_code_and_torch(monkeypatch):
    ex00 = load_exercise(ROOT / "solutions" / "ex00_bytes.ipynb")
    code = cached_plans.code_digest()
    key = cached_plans.plan_key(ex00, code)
    assert key == cached_plans.plan_key(load_exercise(ROOT / "solutions" / "ex00_bytes.ipynb"), code)
    assert key != cached_plans.plan_key(dataclasses.replace(ex00, tests=ex00.tests[:-1]), code)
    assert key != cached_plans.plan_key(ex00, code[::-1])
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    assert key != cached_plans.plan_key(ex00, code)


def test_the_code_digest_follows_every_module_of_the_package(tmp_path, monkeypatch):
    for name, text in (("a.py", "x = 1\n"), ("sub/b.py", "y = 2\n")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(cached_plans, "PACKAGE", tmp_path)
    before = cached_plans.code_digest()
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert cached_plans.code_digest() != before
