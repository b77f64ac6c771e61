"""Running one test and turning its outcome into a pass or a one-line reason.

Used by `check()` in the learner's notebook, by the grader for tests it runs itself, and by the
sandboxed worker (which loads this file by path, so it uses nothing but the standard library).
"""
import traceback


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
            reason = "AssertionError raised by your code: " + bounded(error)
        elif first_line(error):
            reason = first_line(error)
        elif show_source:
            reason = "assertion failed: " + _failing_line(error, source, filename)
        else:
            reason = "an assertion of this test failed"
    except (Exception, SystemExit) as error:
        message = first_line(error) if show_source else bounded(error)
        reason = type(error).__name__ + (": " + message if first_line(error) else "")
    return False, reason


def _failing_line(error, source, filename):
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename == filename and frame.lineno:
            return source.splitlines()[frame.lineno - 1].strip()
    return "(unknown line)"
