"""The course's own answers, made unusable where an exercise asks the learner to write them.

An exercise names, in its solution's metadata (`"mpcourse": {"write_yourself": [...]}`), the
library objects it asks the learner to write, as `"module:qualified.name"` (e.g.
`"mpcourse.memory.accounting:tensor_bytes"`). Before any code of the learner runs, the sandboxed
worker (and `check()`) calls `write_yourself(targets)`: each function's code object is swapped for
one that raises `NotImplementedError("this exercise asks you to write ... yourself")`. The swap is on
the function object itself, so every alias, `getattr`, `from ... import` and library function
that calls it reaches the stub; a class's methods are swapped the same way.

A target written `"module:qualified.name for the learner"` is a stub for the learner's code
only: called from the `mpcourse` package's own files, or from a test computing its expected
value, it still computes, so that an exercise can ask for a function the lesson's library
itself builds on (ex11's stochastic rounding, under every stochastically rounded walk the
notebook measures) and still refuse it to the learner.

What it does not stop: a learner can read the library's source file and copy it, as they could
copy it from the lesson; a determined one can re-execute the module's file to get fresh
functions, or compile their code under a file name inside the package to pass for a library
caller. This file uses only the standard library: the worker loads it by path.
"""
import importlib
import os
import types

MESSAGE = "this exercise asks you to write {name} yourself"
FOR_THE_LEARNER = " for the learner"
#: The `mpcourse` package's folder: calls from files in it are the library's own.
PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
#: How `verdict.run_test` names a test's code: a test computing its expected value may call it.
TEST_FILE = "<test"


def write_yourself(targets):
    """Swap each target's code for a stub; return the names swapped. An unknown target raises
    ValueError naming it (the solution's metadata is wrong)."""
    done = []
    for target in targets:
        learner_only = type(target) is str and target.endswith(FOR_THE_LEARNER)
        name = target.removesuffix(FOR_THE_LEARNER) if learner_only else target
        for function in _functions(_resolve(target)):
            message = MESSAGE.format(name=name.replace(":", "."))
            (_swap_for_the_learner if learner_only else _swap)(function, message)
        done.append(target)
    return done


def _resolve(target):
    if type(target) is str:
        target = target.removesuffix(FOR_THE_LEARNER)
    if type(target) is not str or target.count(":") != 1:
        raise ValueError(f"a target is 'module:qualified.name', got {target!r}")
    module_name, qualname = target.split(":")
    try:
        value = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot find {target!r}: {error}") from None
    return value


def _functions(value):
    """The plain functions behind `value`: itself, a method's function, or a class's methods."""
    value = getattr(value, "__func__", value)
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type):
        found = []
        for attribute in vars(value).values():
            attribute = getattr(attribute, "__func__", attribute)
            if isinstance(attribute, property):
                attribute = attribute.fget
            if isinstance(attribute, types.FunctionType):
                found.append(attribute)
        return found
    raise ValueError(f"{value!r} is neither a function nor a class")


def _swap(function, message):
    """Give `function` a body that raises, keeping its name, signature object and free variables
    (a code object can only be swapped for one with as many)."""
    free = function.__code__.co_freevars
    lines = ["def outer():"] + [f"    {name} = None" for name in free] + [
        "    def stub(*args, **kwargs):",
        *([f"        ({', '.join(free)},)"] if free else []),
        f"        raise NotImplementedError({message!r})",
        "    return stub"]
    namespace = {}
    exec("\n".join(lines), namespace)  # noqa: S102: our own fixed text
    stub = namespace["outer"]()
    function.__code__ = stub.__code__.replace(co_name=function.__code__.co_name,
                                              co_qualname=function.__code__.co_qualname,
                                              co_freevars=free)


def _swap_for_the_learner(function, message):
    """Give `function` a body that raises when the learner's code calls it, and runs its
    original code when the package or a test calls it. The original travels in the stub's constants (a
    function with free variables cannot be handled this way: ValueError)."""
    if function.__code__.co_freevars:
        raise ValueError(f"{function.__qualname__} uses free variables: stub it for everyone")
    original = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                  function.__defaults__)
    original.__kwdefaults__ = function.__kwdefaults__
    namespace = {}
    exec("def stub(*args, **kwargs):\n"  # noqa: S102: our own fixed text
         "    import sys\n"
         "    original = '__original__'\n"
         f"    if sys._getframe(1).f_code.co_filename.startswith(({PACKAGE!r}, {TEST_FILE!r})):\n"
         "        return original(*args, **kwargs)\n"
         f"    raise NotImplementedError({message!r})\n", namespace)
    code = namespace["stub"].__code__
    constants = tuple(original if c == "__original__" else c for c in code.co_consts)
    function.__code__ = code.replace(co_consts=constants, co_name=function.__code__.co_name,
                                     co_qualname=function.__code__.co_qualname)
