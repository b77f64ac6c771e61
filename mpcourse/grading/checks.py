"""A model test's checks, split so that the sandbox computes values and the grader decides.

A test that hands the learner's code a model or an optimizer must run in the learner's process
(`judge`, "beside the answers"). Its verdict must not: whatever runs there can be changed by the
learner. So before such a test is sent, `split_test` rewrites each check in it:

- `assert condition, message`, `raise AssertionError(message)` and `torch.testing.assert_close(...)`
  become a call `__mpcourse_check__(k, leaves, names)`. `leaves` are the values the condition is
  made of (each a `lambda` the sandbox evaluates and logs as plain data), `names` the values the
  message formats. The condition itself, its constants and the message stay here: the sandbox
  receives neither, nor the test's comments.
- The grader rebuilds each condition as an expression over the logged leaves (`Check.holds`) and
  evaluates it with the real torch and math, so a check passes only if the *test's own* condition,
  with the test's own tolerance, holds on the logged data.
- The learner's process could log made-up values. It would have to make up the values the right
  code produces: every leaf is also swapped, one at a time, for the solution's logged value
  (`Check.passes`), so a pair of forged equal values fails against the solution's expected one.

Comprehensions in a condition (`all(torch.equal(p, q) for p, q in pairs)`) are logged as rows of
their element's leaves, so their booleans are computed here too. What the sandbox can read of a
model test: its statements other than checks (the inputs and how the reference is computed) and
the expressions of the leaves, as `ast.unparse` writes them.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import math
from dataclasses import dataclass, field

import torch

from mpcourse.grading import codec

CHECK = "__mpcourse_check__"
ROWS = "__mpcourse_rows__"
TRY = "__mpcourse_try__"
GRADER_MODULES = {"torch": torch, "math": math}
GRADER_BUILTINS = ("abs", "all", "any", "bool", "dict", "enumerate", "float", "int", "isinstance", "len", "list",
                   "max", "min", "range", "repr", "reversed", "round", "set", "sorted", "str", "sum", "tuple",
                   "type", "zip", "AssertionError")
#: Methods of plain values (tensors, lists, dicts, numbers) the grader may call on a logged leaf.
PLAIN_METHODS = frozenset("""abs all any bfloat16 clone contiguous count cpu detach dim double element_size eq
    equal float get half index isfinite isinf isnan item items keys max mean min ne nelement norm numel reshape
    sign signbit size startswith std sum to tolist values view""".split())
ASSERTING_CALLS = ("torch.testing.assert_close",)


def grader_globals(imports: dict | None = None) -> dict:
    """What a check's condition and message may use here: a few builtins, torch, math, and the
    names the solution's setup imports (`imports`: name -> [module, attribute or None])."""
    names = {name: getattr(builtins, name) for name in GRADER_BUILTINS}
    for name, (module, attribute) in (imports or {}).items():
        with contextlib.suppress(Exception):
            loaded = importlib.import_module(module)
            names[name] = loaded if attribute is None else getattr(loaded, attribute)
    return {"__builtins__": {}, **names, **GRADER_MODULES}


def setup_imports(setup) -> dict:
    """Names the solution's setup cells bind by importing: name -> [module, attribute or None]."""
    bound = {}
    for cell in setup:
        try:
            tree = ast.parse(cell)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = [alias.name, None]
                    else:
                        bound[alias.name.split(".")[0]] = [alias.name.split(".")[0], None]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        bound[alias.asname or alias.name] = [node.module, alias.name]
    return bound


@dataclass
class Check:
    """One check of a test: its condition over leaves `__o[i]`, and its message over `names`."""
    condition: str
    message: str | None
    rows: list[bool] = field(default_factory=list)  # per leaf: a comprehension's rows
    names: list[str] = field(default_factory=list)
    call: bool = False  # a call that raises to fail (torch.testing.assert_close)
    imports: dict = field(default_factory=dict)  # setup-imported names it uses (`grader_globals`)

    def holds(self, leaves: list) -> bool:
        try:
            value = eval(self.condition, grader_globals(self.imports), {"__o": leaves})  # noqa: S307: the solution's own code
            return True if self.call else bool(value)
        except Exception:
            return False

    def passes(self, mine: list, theirs: list | None) -> bool:
        """The condition on the learner's leaves, and with each leaf (or each column of a
        comprehension's rows) in turn replaced by the solution's."""
        if not self.holds(mine):
            return False
        if theirs is None or len(theirs) != len(mine):
            return True
        for index, (a, b) in enumerate(zip(mine, theirs)):
            if isinstance(b, (Opaque, Broken)):
                continue
            if not self.rows[index]:
                if not self.holds(mine[:index] + [b] + mine[index + 1:]):
                    return False
                continue
            if type(a) is not list or type(b) is not list or len(a) != len(b):
                continue
            width = min((len(row) for row in a + b if type(row) is list), default=0)
            for column in range(width):
                mixed = [list(row[:column]) + [other[column]] + list(row[column + 1:]) for row, other in zip(a, b)]
                if not self.holds(mine[:index] + [mixed] + mine[index + 1:]):
                    return False
        return True

    def explain(self, names: dict, leaves: list) -> str:
        """The test's own message, formatted here from the logged values of its names."""
        if self.call:  # the asserting call's own message, from the values here
            try:
                eval(self.condition, grader_globals(self.imports), {"__o": leaves})  # noqa: S307: the solution's own code
            except Exception as error:  # noqa: BLE001: its message is the explanation
                return f"{type(error).__name__}: {error}"
        if self.message is None:
            return "a check of this test failed"
        values = {name: _quoted(value) for name, value in names.items()}
        try:
            text = eval(self.message, grader_globals(self.imports), values)  # noqa: S307: the solution's own code
            return str(text)
        except Exception:
            return _static_text(ast.parse(self.message, mode="eval").body)


@dataclass
class SplitTest:
    """A test as the sandbox runs it (`source`) and its checks as the grader judges them."""
    source: str
    checks: list[Check]


def split_tests(sources: list[str], imports: dict | None = None) -> tuple[list[SplitTest], list[Check]]:
    """Rewrite every check of each test into a logging call (see the module's docstring). Checks
    are numbered across all the tests: a test may call a helper an earlier test defined.
    `imports` (`setup_imports`) are names the grader resolves itself."""
    trees = [ast.parse(source) for source in sources]
    assigned = {n.id for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    splitter, out = _Splitter(assigned, imports or {}), []
    for tree in trees:
        first = len(splitter.checks)
        tree = ast.fix_missing_locations(splitter.visit(tree))
        out.append(SplitTest(ast.unparse(tree), splitter.checks[first:]))
    return out, splitter.checks


class _Splitter(ast.NodeTransformer):
    def __init__(self, assigned: set[str], imports: dict):
        self.assigned, self.checks, self.imports = assigned, [], imports

    def visit_FunctionDef(self, node):
        """A helper's docstring stays here: only code the test runs goes to the sandbox."""
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
        return self.generic_visit(node)

    def visit_Assert(self, node):
        return self._check(node.test, node.msg, node)

    def visit_Raise(self, node):
        exc = node.exc
        if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id == "AssertionError" \
                and "AssertionError" not in self.assigned:
            return self._check(ast.Constant(False), exc.args[0] if exc.args else None, node)
        if isinstance(exc, ast.Name) and exc.id == "AssertionError":
            return self._check(ast.Constant(False), None, node)
        return self.generic_visit(node)

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in ASSERTING_CALLS:
            return self._check(node.value, None, node, call=True)
        return self.generic_visit(node)

    def _check(self, condition, message, node, call=False):
        leaves = _Leaves(self)
        rebuilt = leaves.split(condition)
        names = sorted(_free_names(message, self)) if message is not None else []
        used = {n.id for part in (rebuilt, message) if part is not None for n in ast.walk(part) if isinstance(n, ast.Name)}
        self.checks.append(Check(ast.unparse(rebuilt), None if message is None else ast.unparse(message),
                                 leaves.rows, names, call, {n: self.imports[n] for n in used
                                                            if n in self.imports and self.grader_name(n)}))
        logged = ast.Call(ast.Name(CHECK, ast.Load()), [
            ast.Constant(len(self.checks) - 1),
            ast.List([_thunk(e) for e in leaves.sandbox], ast.Load()),
            ast.List([ast.Tuple([ast.Constant(n), _thunk(ast.Name(n, ast.Load()))], ast.Load()) for n in names],
                     ast.Load())], [])
        return ast.copy_location(ast.Expr(logged), node)

    def grader_name(self, name: str) -> bool:
        return name not in self.assigned and (name in GRADER_MODULES or name in GRADER_BUILTINS
                                              or name in self.imports)


class _Leaves:
    """The leaves of one condition (or one comprehension's element), in the order logged."""

    def __init__(self, splitter: _Splitter, var: str = "__o"):
        self.splitter, self.var, self.sandbox, self.rows = splitter, var, [], []

    def leaf(self, expr, rows=False):
        self.sandbox.append(expr)
        self.rows.append(rows)
        return ast.Subscript(ast.Name(self.var, ast.Load()), ast.Constant(len(self.sandbox) - 1), ast.Load())

    def split(self, node):
        """`node` rebuilt over leaves: what plain data can decide stays here, the rest is a leaf."""
        if isinstance(node, ast.Constant) or isinstance(node, ast.Lambda):
            return node
        if isinstance(node, ast.Starred):
            return ast.Starred(self.split(node.value), node.ctx)
        if isinstance(node, ast.Name):
            return node if self.splitter.grader_name(node.id) else self.leaf(node)
        if isinstance(node, ast.Attribute) and self._grader_attribute(node):
            return node
        if isinstance(node, (ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List,
                             ast.Set, ast.keyword)):
            return self._split_children(node)
        if isinstance(node, ast.Call) and self._grader_call(node) and not any(
                isinstance(a, ast.Starred) for a in node.args):
            func = node.func
            if isinstance(func, ast.Attribute) and not self._grader_attribute(func):
                func = ast.Attribute(self.split(func.value), func.attr, ast.Load())
            return ast.Call(func, [self.split(a) for a in node.args], [self.split(k) for k in node.keywords])
        if isinstance(node, (ast.GeneratorExp, ast.ListComp)) and len(node.generators) >= 1:
            return self._comprehension(node)
        return self.leaf(node)

    def _split_children(self, node):
        for name, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                setattr(node, name, self.split(value))
            elif isinstance(value, list):
                setattr(node, name, [self.split(v) if isinstance(v, (ast.expr, ast.keyword)) else v for v in value])
        return node

    def _comprehension(self, node):
        """Rows of the element's leaves, one per item, computed there; the element judged here."""
        depth = self.var.count("_r") + 1
        inner = _Leaves(self.splitter, f"__r{depth}")
        element = inner.split(node.elt)
        row = ast.List([_tried(e) for e in inner.sandbox], ast.Load())
        rows = ast.Call(ast.Name(ROWS, ast.Load()), [ast.ListComp(row, node.generators)], [])
        placeholder = self.leaf(rows, rows=True)
        loop = [ast.comprehension(ast.Name(inner.var, ast.Store()), placeholder, [], 0)]
        kind = ast.GeneratorExp if isinstance(node, ast.GeneratorExp) else ast.ListComp
        return kind(element, loop)

    def _grader_attribute(self, node) -> bool:
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and self.splitter.grader_name(root.id) and root.id not in GRADER_BUILTINS

    def _grader_call(self, node) -> bool:
        func = node.func
        if isinstance(func, ast.Name):
            return self.splitter.grader_name(func.id)
        if isinstance(func, ast.Attribute):
            return self._grader_attribute(func) or func.attr in PLAIN_METHODS
        return False


def _thunk(expr):
    return ast.Lambda(ast.arguments([], [], None, [], [], None, []), expr)


def _tried(expr):
    return ast.Call(ast.Name(TRY, ast.Load()), [_thunk(expr)], [])


def _free_names(node, splitter: _Splitter) -> set[str]:
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.arg for n in ast.walk(node) if isinstance(n, ast.Lambda) for a in n.args.args}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and n.id not in bound and not splitter.grader_name(n.id)}


def _static_text(node) -> str:
    """A message's own words without its formatted values (when they cannot be rebuilt)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp):
        return _static_text(node.left) + _static_text(node.right)
    return "a check of this test failed"


class Quoted(str):
    """A string the learner's process sent: formatted quoted and cut short."""
    LIMIT = 60

    def __format__(self, spec):
        return repr(self) if len(self) <= self.LIMIT else repr(self[:self.LIMIT]) + "…"

    __str__ = __format__


def _quoted(value):
    if type(value) is str:
        return Quoted(value)
    if type(value) is list:
        return [_quoted(v) for v in value]
    return value


class Opaque:
    """A logged value that was not plain data: only its type's name came back."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self):
        return f"<a {self.type_name}>"


class Broken:
    """A leaf whose evaluation raised in the sandbox; any use of it fails the check."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __getattr__(self, name):
        raise ValueError(f"the value raised {self.type_name}")

    def __eq__(self, other):
        raise ValueError(f"the value raised {self.type_name}")

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __eq__
    __hash__ = None

    def __iter__(self):
        raise ValueError(f"the value raised {self.type_name}")


def decode_leaf(data, depth=0):
    """A logged leaf back to a value: plain data, rows, or a marker for what was not."""
    if type(data) is dict and data.get("$") == "opaque":
        return Opaque(_name(data.get("type")))
    if type(data) is dict and data.get("$") == "leaf-error":
        return Broken(_name(data.get("type")))
    if type(data) is dict and data.get("$") == "rows":
        rows = data.get("items")
        if type(rows) is not list or depth > 4 or not all(type(r) is list for r in rows):
            raise codec.MalformedData("rows are not a list of lists")
        return [[decode_leaf(v, depth + 1) for v in row] for row in rows]
    if type(data) is dict and data.get("$") == "raised":
        return codec.decode_error(data)
    try:
        return codec.decode(data)
    except codec.MalformedData:  # e.g. a dataclass of a module the grader has not loaded
        return Opaque("value the grader cannot rebuild")


def _name(value) -> str:
    return value[:60] if type(value) is str and value.isidentifier() else "object"
