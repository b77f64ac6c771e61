"""The package a contributor can find their way around: small modules, one source for each fact."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
from grading_budgets import program_backstop

PACKAGE = Path(__file__).resolve().parent.parent / "mpcourse"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MAX_LINES = 400
ROOT = PACKAGE.parent


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_is_longer_than_a_reader_can_hold(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines; split it by concept (at most {MAX_LINES})"


def _literals(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            values = {ast.unparse(v) for v in node.values}
            yield "dict", keys, values, node.lineno
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            yield "sequence", {e.value for e in node.elts if isinstance(e, ast.Constant)}, set(), node.lineno


def test_precision_names_and_their_dtypes_are_written_only_in_mpcourse_precision():
    """The run precisions ("fp32", "tf32", "bf16", "fp16") and the 16-bit autocast dtypes by name
    are facts the loop, the CLI, the lab, the hardware report and the multi-process runs share:
    one copy, in `mpcourse/numbers/precision.py`, so that adding a precision is one edit. (Tables keyed
    by these names that hold other facts, e.g. what a device accelerates, are not copies.)"""
    copies = []
    for path in MODULES:
        if path.name == "precision.py":
            continue
        for kind, keys, values, line in _literals(ast.parse(path.read_text())):
            names_all_precisions = kind == "sequence" and {"fp32", "tf32", "bf16", "fp16"} <= keys
            maps_names_to_dtypes = kind == "dict" and {"bf16", "fp16"} <= keys and \
                {"torch.bfloat16", "torch.float16"} <= values
            if names_all_precisions or maps_names_to_dtypes:
                copies.append(f"{_name(path)}:{line}")
    assert not copies, f"a second copy of mpcourse.numbers.precision's names: {copies}"


VIEWS = PACKAGE / "views"
#: The two front ends, which show results and so may import views.
FRONT_ENDS = {PACKAGE / "cli.py", PACKAGE / "widgets.py"}


def _imported_modules(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, node.lineno
            yield from ((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)


def test_a_mechanism_never_imports_a_view():
    """Mechanisms compute and views show: a mechanism that imports a view closes an import
    circle (views read mechanisms' results) and ties a computation to its presentation."""
    offenders = [f"{_name(path)}:{line} imports {module}"
                 for path in MODULES if VIEWS not in path.parents and path not in FRONT_ENDS
                 for module, line in _imported_modules(ast.parse(path.read_text()))
                 if module == "mpcourse.views" or module.startswith("mpcourse.views.")]
    assert not offenders, offenders


@pytest.mark.parametrize("path", sorted(VIEWS.glob("*.py")), ids=_name)
def test_a_view_only_reads_results(path):
    """A view draws what a mechanism computed and never trains: no backward pass, no optimizer
    step, no scaler (the results arrive as arguments: a `StepDtypes`, a `RunResult`, a trace)."""
    training = [f"{_name(path)}:{node.lineno}: {ast.unparse(node)}"
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and (node.func.attr == "backward"
                     or ast.unparse(node.func).startswith(("torch.optim.", "torch.amp.")))]
    assert not training, training


def _loads_torch(code: str) -> bool:
    """Whether running `code` in a new Python loads torch (its last line of output says)."""
    done = subprocess.run([sys.executable, "-c", code + "\nprint('torch' in sys.modules)"], cwd=ROOT,
                          capture_output=True, text=True, timeout=program_backstop())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1] == "True"


def test_import_mpcourse_leaves_torch_unloaded_until_a_name_needs_it():
    """`import mpcourse` is instant; `mpcourse.BF16` and `from mpcourse import RunConfig` still work,
    loading torch then (benchmarks/bench_cli_help.py times it)."""
    assert not _loads_torch("import sys, mpcourse")
    assert _loads_torch("import sys, mpcourse\nassert mpcourse.BF16.mantissa_bits == 7")
    assert _loads_torch("import sys\nfrom mpcourse import RunConfig\nfrom mpcourse.machine import hardware\n"
                        "assert hardware.__name__ and RunConfig")
    assert _loads_torch("import sys, mpcourse\nassert mpcourse.amp.GradScaler is mpcourse.GradScaler")


@pytest.mark.parametrize("argv", [["--help"], ["doctor", "--help"], ["hosted", "--help"],
                                  ["grade", "--help"]], ids=" ".join)
def test_the_cli_help_leaves_torch_unloaded(argv):
    code = (f"import sys\nfrom mpcourse.cli import main\ntry:\n    main({argv!r})\n"
            "except SystemExit as done:\n    assert done.code == 0, done.code")
    assert not _loads_torch(code)


def test_a_command_that_trains_gets_all_its_options():
    from mpcourse.cli import build_parser
    args = build_parser("train").parse_args(["train", "--precision", "bf16", "--steps", "3"])
    assert (args.precision, args.steps) == ("bf16", 3)
    full = build_parser().parse_args(["compare", "--precisions", "fp32", "--json"])
    assert full.json and full.precisions == "fp32"


#: The course's parts, lowest first: a part imports only parts on its own level or below. `course`
#: (the course map, plain data that `machine.hardware` reads) sits at the bottom; the front ends
#: (`cli`, `widgets`, `hosted`, `hosted_session` and `mpcourse/__init__.py`) at the top.
LEVELS = (
    ("numbers", "memory", "machine", "course"),
    ("amp", "lowbit", "optim"),
    ("train", "distributed", "clinic"),
    ("views", "grading", "cli", "widgets", "hosted", "hosted_session", "__init__"),
)
LEVEL = {part: level for level, parts in enumerate(LEVELS) for part in parts}
#: mpcourse's modules by dotted name (a package by its __init__.py).
BY_NAME = {".".join(p.relative_to(ROOT).with_suffix("").parts[:-1] if p.name == "__init__.py"
                    else p.relative_to(ROOT).with_suffix("").parts): p for p in MODULES}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _edges(path: Path):
    """The mpcourse modules that `path` imports, anywhere in it (a function's body and `if
    TYPE_CHECKING:` included), with the line: `from package import submodule` imports the
    submodule, `from module import name` the module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names if alias.name in BY_NAME)
        elif isinstance(node, ast.ImportFrom) and node.module in BY_NAME:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield (sub if sub in BY_NAME else node.module), node.lineno


def test_every_part_of_the_package_has_a_level():
    parts = {_part(name) for name in BY_NAME} - {"__init__"}
    assert parts == set(LEVEL) - {"__init__"}, f"parts without a level: {parts - set(LEVEL)}; " \
        f"levels without a part: {set(LEVEL) - parts - {'__init__'}}"


def test_a_part_never_imports_a_part_above_it():
    """The folders read as the course, lowest first: numbers, memory and the machine; then amp,
    low-bit formats and optimizers; then training, distributed runs and the clinic; then views,
    grading and the front ends. A lower part that imports a higher one is a lesson that needs a
    later lesson's machinery."""
    upward = [f"{_name(BY_NAME[name])}:{line} ({_part(name)}, level {LEVEL[_part(name)]}) imports "
              f"{target} ({_part(target)}, level {LEVEL[_part(target)]})"
              for name, path in BY_NAME.items() for target, line in _edges(path)
              if LEVEL[_part(target)] > LEVEL[_part(name)]]
    assert not upward, "a part imports a part above it: " + "; ".join(upward)


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in `graph`, as the modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circle_among_the_modules():
    """No module imports, directly or through others, a module that imports it: not even inside a
    function or under TYPE_CHECKING, where a circle waits for the day someone moves the import up.
    Within a package, modules import each other by their own paths, never through the package's
    front door (its __init__ imports them)."""
    graph = {name: {target for target, _ in _edges(path) if target != name} for name, path in BY_NAME.items()}
    circle = _circle(graph)
    assert circle is None, "an import circle: " + " -> ".join(circle)


def test_the_circle_finder_finds_circles():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("package", sorted({p.parent for p in MODULES if p.parent != PACKAGE}), ids=_name)
def test_no_package_holds_more_than_ten_modules(package):
    modules = [p for p in package.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 10, f"{_name(package)} holds {len(modules)} modules; split it by concept"


def test_the_top_level_holds_only_the_front_ends():
    assert {p.stem for p in PACKAGE.glob("*.py")} == {"__init__", "cli", "course", "hosted", "hosted_session",
                                                     "widgets"}


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_lessons_take_their_pictures_from_the_views_front_door(notebook):
    """A lesson draws with `from mpcourse.views import ...`: no lesson teaches how a view draws, so
    none needs a view module's own path (the mechanisms' modules, whose insides lessons do teach,
    may be imported by path)."""
    import nbformat
    code = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
    by_path = [line for line in code.splitlines() if line.lstrip().startswith(("from mpcourse.views.",
                                                                              "import mpcourse.views."))]
    assert not by_path, f"{notebook.name} imports views by module path: {by_path}"
