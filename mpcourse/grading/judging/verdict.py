"""Running one test and turning its outcome into a pass or a one-line reason.

Used by `check()` in the learner's notebook, by the grader for tests it runs itself, and by the
sandboxed worker (which loads this file by path, so it uses nothing but the standard library).
"""
import traceback


class NoAnswer(BaseException):
    """The learner's side could not answer a test's call: its reply was malformed, or its process
    died or stalled. A BaseException, so that a test's own `except Exception` (or `except
    ValueError`) cannot take it for the learner's function raising; the reason is the grader's."""


def first_line(text, limit=300):
    """The first non-empty line of `text`, cut to `limit` characters."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def bounded(text, limit=80):
    """Text that may come from a submission: its first line, quoted and cut to `limit` characters."""
    line = first_line(text, limit + 1)
    return repr(line[:limit]) + ("…" if len(line) > limit else "")


class Quoted(str):
    """A string the learner's side sent, for a reason: under `str()`, `%`, `format` and f-strings
    alike it shows as its repr, cut to `LIMIT` characters, so a reason never carries more than a
    line's worth of a submission's text."""
    LIMIT = 60

    def _shown(self):
        text = str.__str__(self)
        return repr(text) if len(text) <= self.LIMIT else repr(text[:self.LIMIT]) + "…"

    def __format__(self, spec):
        return format(self._shown(), spec)

    def __str__(self):
        return self._shown()

    def __repr__(self):
        return self._shown()

    def __add__(self, other):
        return self._shown() + other

    def __radd__(self, other):  # tried before str's own `+`, as Quoted subclasses str
        return other + self._shown()


def quoted(value, depth=0):
    """`value` with every string in it, however deeply nested in lists, tuples, sets and dicts,
    a `Quoted`; containers past a few levels, or long, are cut too."""
    if isinstance(value, str):
        return Quoted(value)
    if depth > 4:
        return Quoted("…")
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [quoted(v, depth + 1) for v in list(value)[:8]] + ([Quoted("…")] if len(value) > 8 else [])
        return type(value)(items) if type(value) in (list, tuple) else items
    if isinstance(value, dict):
        return {quoted(k, depth + 1): quoted(v, depth + 1) for k, v in list(value.items())[:8]}
    return value


def run_test(source, namespace, name="test", show_source=True):
    """Run a test's code in `namespace`; return (passed, reason). A test passes if nothing raises.

    An assertion's reason is its own message. `show_source` is for the learner's own notebook: an
    assertion without a message shows its line, another exception its message. In the grader
    (False) a hidden test's code must not reach a gradebook, so such an assertion says only that
    it failed, and an exception's message, which may carry a submission's text, is quoted and cut
    short."""
    filename = "<test " + name + ">"
    try:
        exec(compile(source, filename, "exec"), namespace)
        return True, None
    except AssertionError as error:
        if getattr(error, "mpcourse_from_submission", False):
            reason = "AssertionError raised by your code: " + str(Quoted(first_line(error)))
        elif first_line(error):
            reason = first_line(error)
        elif show_source:
            reason = "assertion failed: " + _failing_line(error, source, filename)
        else:
            reason = "an assertion of this test failed"
    except NoAnswer as error:
        reason = first_line(error)
    except (Exception, SystemExit) as error:
        message = first_line(error) if show_source else bounded(error)
        reason = type(error).__name__ + (": " + message if first_line(error) else "")
    return False, reason


def _failing_line(error, source, filename):
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename == filename and frame.lineno:
            return source.splitlines()[frame.lineno - 1].strip()
    return "(unknown line)"
