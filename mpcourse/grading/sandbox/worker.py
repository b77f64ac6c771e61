"""The process that runs a submission's code, inside the sandbox, and answers the grader's requests.

Started by `mpcourse.grading.sandbox.sandbox` as `python -I worker.py LIMITS`. It reads one JSON request
per line on stdin and writes one JSON reply per line on its original stdout; the learner's own
output goes to stderr, which the grader counts and discards. Before any learner code runs it
sets its resource limits and, started as root, becomes an unprivileged user.

Nothing here is trusted: the learner's code runs in this process and may change any of it. The
grader treats every reply as untrusted data (`codec.decode`), never as a verdict.

Requests (`op`): `run_cell` (a learner's code cell), `stub` (the library answers the exercise asks
for), `describe` (what each answer name holds), `value`, `call` and `code_names` (one answer, for
a test running in the grader). A `call` brings its arguments as data (`states.Sender`): the models,
optimizers and scalers a test hands the learner's function are rebuilt here from their classes
and states, and their states after the call go back. No test code ever comes here.
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


def _load(package, name):
    """A module of grading's `package` by path: this process must not import mpcourse (and its
    dependencies)."""
    path = Path(__file__).parent.parent / package / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_mpcourse_grading_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where a sibling finds it (`states` takes this `codec`)
    spec.loader.exec_module(module)
    return module


codec, states = _load("judging", "codec"), _load("judging", "states")
verdict, stubs = _load("judging", "verdict"), _load("judging", "stubs")
seccomp, landlock = _load("sandbox", "seccomp"), _load("sandbox", "landlock")
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
        seccomp.install(bytes.fromhex(limits["seccomp"]))
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
    of /root. Import paths, and those of packages already imported, are rewritten to it. Only
    absolute entries are folders: a relative one is the working folder or a path hook's key
    (setuptools' editable install adds `__editable__.<name>.finder.__path_hook__`)."""
    moved = {}
    for entry in list(sys.path):
        blocked = _blocked(entry) if os.path.isabs(entry) else None
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


class Answers:
    """The requests about the learner's answers, on a namespace: what a test running elsewhere
    may ask of them. `check()` serves the same requests in the learner's kernel (`handle`), so a
    test meets the learner's functions through the same data in both places."""

    OPS = ("describe", "value", "call", "code_names")

    def __init__(self, namespace):
        self.namespace = namespace

    def handle(self, request):
        """One request (a dict with "op") to its reply; a failure is a reply saying what failed."""
        request = dict(request)
        op = request.pop("op", None)
        if op not in self.OPS + getattr(self, "MORE_OPS", ()):
            return {"failed": f"unknown request {str(op)[:40]!r}"}
        try:
            return getattr(self, op)(**request)
        except BaseException as error:  # noqa: BLE001: the reply says what went wrong
            return {"failed": _describe(error)}

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
        """Call one answer on objects rebuilt from the test's arguments (`states.Receiver`); reply
        with its result or exception and every object's state after the call. `watch`: dtypes
        the exercise asks the learner to produce by hand; a torch op making a tensor of one
        becomes evidence (data for an instructor's note, never a verdict: this process could
        hide it)."""
        receiver = states.Receiver()
        args, kwargs = receiver.decode(args), receiver.decode(kwargs)
        if type(args) is not list or type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
            raise codec.MalformedData("a call's arguments are a list and a dict of names")
        watcher = _CastWatcher(watch)
        try:
            with watcher:
                result = self.answer(name)(*args, **kwargs)
            reply = {"value": receiver.encode_result(result)}
        except Exception as error:  # noqa: BLE001: the test decides what an exception means
            reply = {"raised": codec.encode_error(error)}
        reply["evidence"] = sorted(watcher.seen)[:8]
        reply["after"] = receiver.after()
        return reply

    def code_names(self, name):
        return {"names": [str(n) for n in getattr(self.answer(name), "__code__").co_names]}


class Worker(Answers):
    """The requests this process serves, on an IPython shell's namespace (so a learner's `%`
    magics and `display()` work as in Jupyter): the answers', and running the learner's cells."""

    MORE_OPS = ("run_cell", "stub")

    def __init__(self):
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        config = Config()
        config.HistoryManager.enabled = False  # no history database, in the sandbox or anywhere else
        shell = InteractiveShell.instance(config=config, colors="NoColor")
        shell.enable_gui = lambda _gui=None: None  # `%matplotlib inline` needs no event loop, as in Jupyter
        super().__init__(shell.user_ns)
        self.shell = shell

    def run_cell(self, source):
        result = self.shell.run_cell(source, store_history=False)
        error = result.error_before_exec or result.error_in_exec
        return {"error": None if error is None else _describe(error)}

    def stub(self, targets):
        """The library objects the exercise asks the learner to write become stubs (`stubs`)."""
        return {"stubbed": stubs.write_yourself(targets)}


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
        number = request.pop("id")
        reply = worker.handle(request)
        replies.write(dumps(dict(reply, id=number)) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
