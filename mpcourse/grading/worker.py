"""The process that runs a submission's code, inside the sandbox, and answers the grader's requests.

Started by `mpcourse.grading.sandbox` as `python -I worker.py LIMITS`. It reads one JSON request
per line on stdin and writes one JSON reply per line on its original stdout; the learner's own
output goes to stderr, which the grader counts and discards. Before any learner code runs it
sets its resource limits and, started as root, becomes an unprivileged user.

Nothing here is trusted: the learner's code runs in this process and may change any of it. The
grader treats every reply as untrusted data (`codec.decode`), never as a verdict.

Requests (`op`): `run_cell` (a learner's code cell), `describe` (what each answer name holds),
`value`, `call` and `code_names` (one answer, for a test running in the grader), `load` (the
setup and every code cell of the learner, for model tests) and `record` (run model tests, as
`checks.split_test` rewrote them, and log the values their checks are made of).
"""
import importlib.util
import json
import os
import resource
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _load(name):
    """A sibling module by path: this process must not import mpcourse (and its dependencies)."""
    spec = importlib.util.spec_from_file_location(f"_mpcourse_grading_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


codec, verdict, stubs = _load("codec"), _load("verdict"), _load("stubs")
seccomp, landlock = _load("seccomp"), _load("landlock")
dumps, loads = json.dumps, json.loads  # taken before any learner code can replace them


def confine(limits):
    """Resource limits, the walls and the seccomp filter when no bubblewrap made them (the
    fallback sandbox: `landlock`, `seccomp.install`), then (when root) the sandbox's own
    unprivileged uid, no other sandbox's: before any learner code runs. RLIMIT_NPROC counts the
    uid's threads, so with a uid per sandbox it bounds this sandbox alone; RLIMIT_NOFILE bounds
    the pipes and sockets (and so the kernel buffers) it can hold; RLIMIT_CPU bounds each process
    (the grader's budgets count the sandbox as a whole)."""
    for name, value in (("RLIMIT_AS", limits.get("memory")), ("RLIMIT_CPU", limits.get("cpu")),
                        ("RLIMIT_FSIZE", limits.get("file_size")), ("RLIMIT_NPROC", limits.get("processes")),
                        ("RLIMIT_NOFILE", limits.get("open_files")), ("RLIMIT_CORE", 0)):
        if value is not None:
            resource.setrlimit(getattr(resource, name), (int(value), int(value)))
    if limits.get("landlock"):  # raises if the kernel refuses: then no learner code runs
        landlock.restrict(limits["landlock"]["read"], limits["landlock"]["write"])
    if limits.get("seccomp"):
        seccomp.install()
    user = limits.get("user")
    if user is not None and os.getuid() == 0:
        if limits.get("seccomp"):  # the fallback: no bubblewrap made Python's folders traversable
            _keep_python_reachable()
        os.setgroups([])
        os.setgid(user)
        os.setuid(user)


def _blocked(path):
    """The topmost folder on `path`'s way that others may not search (None if all may)."""
    for parent in reversed(Path(path).parents):
        if str(parent) != "/" and not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def _keep_python_reachable():
    """Python's own folders as the unprivileged uid will reach them. A Python installed under a
    folder only root may enter (pyenv's /root/.pyenv) is reached through a descriptor opened now,
    as root, on the folder just inside (/proc/self/fd/N/...): only those folders, nothing else
    of /root. Import paths, and those of packages already imported, are rewritten to it."""
    moved = {}
    for entry in list(sys.path):
        blocked = _blocked(entry) if entry else None
        if blocked is None:
            continue
        inside = blocked / Path(entry).relative_to(blocked).parts[0]
        if str(inside) not in moved:
            moved[str(inside)] = f"/proc/self/fd/{os.open(inside, os.O_PATH | os.O_DIRECTORY)}"

    def reroute(path):
        for old, new in moved.items():
            if path == old or path.startswith(old + "/"):
                return new + path[len(old):]
        return path
    if moved:
        sys.path[:] = [reroute(p) for p in sys.path]
        for module in list(sys.modules.values()):
            search = getattr(module, "__path__", None)
            if type(search) is list:
                search[:] = [reroute(p) for p in search]
        sys.path_importer_cache.clear()


class Recorder:
    """An answer wrapped so that each call a test makes is logged: whether it could have gone
    through plain data (`codec.encode`) instead. The trusted run of the solution uses this to
    choose where each test runs (`judge.calibrate`). Calls an answer makes to another answer are
    not logged: only the test's own calls count.
    """
    depth = 0

    def __init__(self, name, target, log):
        self._name, self._target, self._log = name, target, log

    def __call__(self, *args, **kwargs):
        if Recorder.depth:
            return self._target(*args, **kwargs)
        before = _plain_shape((args, kwargs))
        Recorder.depth += 1
        try:
            result = self._target(*args, **kwargs)
        except BaseException:
            self._log.append({"call": self._name, "plain": before is not None})
            raise
        finally:
            Recorder.depth -= 1
        plain = before is not None and before == _plain_shape((args, kwargs)) and _plain_shape(result) is not None
        self._log.append({"call": self._name, "plain": plain})
        return result

    def __getattr__(self, attribute):
        if attribute != "__code__":  # the grader can answer __code__ for a test it runs itself
            self._log.append({"call": self._name, "attribute": attribute, "plain": False})
        return getattr(self._target, attribute)


def _plain_shape(value):
    """`value` as plain data with tensor contents left out (in-place tensor changes are carried
    back separately), or None if it is not plain data."""
    try:
        encoded = codec.encode(value)
    except codec.NotPlainData:
        return None
    return _strip_data(encoded)


def _strip_data(encoded):
    if isinstance(encoded, list):
        return "[" + ",".join(_strip_data(v) for v in encoded) + "]"
    if isinstance(encoded, dict):
        return "{" + ",".join(f"{k}:{_strip_data(v)}" for k, v in encoded.items() if k != "data") + "}"
    return json.dumps(encoded)


# ---- a model test's checks, as `checks.split_test` rewrote them: values logged, never judged ----

MAX_NAME_CHARS = 4000  # a message's value bigger than this is logged by its type only


class _Rows:
    def __init__(self, rows):
        self.rows = rows


class _LeafError:
    def __init__(self, error):
        self.type = type(error).__name__


def _tried(thunk):
    try:
        return thunk()
    except Exception as error:  # noqa: BLE001: the grader decides what a failed value means
        return _LeafError(error)


def _encode_leaf(value):
    if isinstance(value, _Rows):
        return {"$": "rows", "items": [[_encode_leaf(v) for v in row] for row in value.rows]}
    if isinstance(value, _LeafError):
        return {"$": "leaf-error", "type": value.type}
    if isinstance(value, BaseException):
        return codec.encode_error(value)
    try:
        return codec.encode(value)
    except Exception:  # noqa: BLE001: not plain data, or a value that fails to encode
        return {"$": "opaque", "type": type(value).__name__}


def _check_logger(entries):
    def check(number, leaves, names):
        logged = {}
        for name, thunk in names:
            encoded = _encode_leaf(_tried(thunk))
            logged[name] = encoded if len(dumps(encoded)) <= MAX_NAME_CHARS else {"$": "opaque", "type": "large"}
        entries.append({"k": number, "leaves": [_encode_leaf(_tried(t)) for t in leaves], "names": logged})
    return check


class Worker:
    """The requests this process serves, one method each, on an IPython shell's namespace (so a
    learner's `%` magics and `display()` work as in Jupyter)."""

    def __init__(self):
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        config = Config()
        config.HistoryManager.enabled = False  # no history database, in the sandbox or anywhere else
        self.shell = InteractiveShell.instance(config=config, colors="NoColor")
        self.shell.enable_gui = lambda gui=None: None  # `%matplotlib inline` needs no event loop, as in Jupyter
        self.namespace = self.shell.user_ns

    def run_cell(self, source):
        result = self.shell.run_cell(source, store_history=False)
        error = result.error_before_exec or result.error_in_exec
        return {"error": None if error is None else _describe(error)}

    def describe(self, names):
        return {"kinds": {n: ("missing" if n not in self.namespace else
                              "callable" if callable(self.namespace[n]) else "value") for n in names}}

    def answer(self, name):
        if name not in self.namespace:
            raise NameError(f"name {name!r} is not defined")
        return self.namespace[name]

    def value(self, name):
        return {"value": codec.encode(self.answer(name))}

    def call(self, name, args, kwargs, watch=()):
        """Call one answer on a copy of the test's arguments. `watch`: dtypes the exercise asks
        the learner to produce by hand; a torch op making a tensor of one becomes evidence (data
        for an instructor's note, never a verdict: this process could hide it)."""
        args, kwargs = codec.decode(args), codec.decode(kwargs)
        tensors = codec.tensors_in((args, kwargs))
        before = [t.clone() for t in tensors]
        watcher = _CastWatcher(watch)
        try:
            with watcher:
                reply = {"value": codec.encode(self.answer(name)(*args, **kwargs))}
        except Exception as error:
            reply = {"raised": codec.encode_error(error)}
        reply["evidence"] = sorted(watcher.seen)[:8]
        reply["mutated"] = [[i, codec.encode(t)] for i, (t, b) in enumerate(zip(tensors, before))
                            if t.shape != b.shape or t.dtype != b.dtype or not _same_bits(t, b)]
        return reply

    def code_names(self, name):
        return {"names": [str(n) for n in getattr(self.answer(name), "__code__").co_names]}

    def stub(self, targets):
        """The library objects the exercise asks the learner to write become stubs (`stubs`)."""
        return {"stubbed": stubs.write_yourself(targets)}

    def load(self, setup, cells, write_yourself=()):
        """The setup, every code cell of the learner (as Jupyter runs them), the setup again (its
        helpers as the tests expect them); return the cells' errors."""
        stubs.write_yourself(write_yourself)
        for cell in setup:  # imports and helpers first: an answer's defaults may use them
            verdict.run_test(cell, self.namespace, "setup")
        errors = [e for e in (self.run_cell(c)["error"] for c in cells) if e]
        for cell in setup:
            verdict.run_test(cell, self.namespace, "setup")
        return {"errors": errors}

    def record(self, answers, tests, log_calls=False):
        """Run tests rewritten by `checks.split_test` beside the answers; per test, the values of
        its checks and the exception that ended it, if any (and, for the trusted run of the
        solution, whether each call of an answer could go through plain data)."""
        # The tests get their own namespace: what they define (hidden helpers included) is not
        # among the globals of the learner's functions.
        calls, out, tests_namespace = [], [], dict(self.namespace)
        if log_calls:
            for name in answers:
                if name in self.namespace and callable(self.namespace[name]):
                    tests_namespace[name] = Recorder(name, self.namespace[name], calls)
        tests_namespace.update(__mpcourse_rows__=_Rows, __mpcourse_try__=_tried)
        for test_id, source in tests:
            calls.clear()
            entries = []
            tests_namespace["__mpcourse_check__"] = _check_logger(entries)
            try:
                exec(compile(source, "<test>", "exec"), tests_namespace)
                raised = None
            except BaseException as error:  # noqa: BLE001: the grader decides
                raised = codec.encode_error(error)
            out.append({"id": test_id, "checks": entries, "raised": raised, "calls": list(calls)})
        return {"tests": out}


class _CastWatcher(TorchDispatchMode):
    """Records the torch ops that make a tensor of a watched dtype while an answer runs."""

    def __init__(self, watch):
        super().__init__()
        self.watch, self.seen = {str(d) for d in watch}, set()

    def __enter__(self):
        return super().__enter__() if self.watch else self

    def __exit__(self, *exc):
        return super().__exit__(*exc) if self.watch else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            dtype = str(leaf.dtype).removeprefix("torch.") if isinstance(leaf, torch.Tensor) else None
            if dtype in self.watch:
                self.seen.add(f"{func} made a {dtype} tensor")
        return out


def _describe(error):
    message = verdict.first_line(error, 300)
    return type(error).__name__ + (": " + message if message else "")


def _same_bits(a, b):
    return a.numel() == 0 or a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))


def main():
    limits = loads(sys.argv[1])
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    os.dup2(2, 1)  # the learner's prints go to stderr, which the grader counts and drops
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = open(os.devnull)
    worker = Worker()
    confine(limits)
    replies.write(dumps({"ready": True, "id": 0}) + "\n")
    replies.flush()
    for line in requests:
        request = loads(line)
        op, number = request.pop("op"), request.pop("id")
        try:
            reply = getattr(worker, op)(**request)
        except BaseException as error:  # noqa: BLE001: the reply says what went wrong
            reply = {"failed": _describe(error)}
        replies.write(dumps(dict(reply, id=number)) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
