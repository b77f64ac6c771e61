"""The package a contributor can find their way around: small modules, one source for each fact."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mpcourse"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
MAX_LINES = 400


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
    one copy, in `mpcourse/precision.py`, so that adding a precision is one edit. (Tables keyed
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
    assert not copies, f"a second copy of mpcourse.precision's names: {copies}"
