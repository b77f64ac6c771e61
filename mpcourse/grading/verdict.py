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


def run_test(source, namespace, name="test"):
    """Run a test's code in `namespace`; return (passed, reason). A test passes if nothing raises."""
    filename = "<test " + name + ">"
    try:
        exec(compile(source, filename, "exec"), namespace)
        return True, None
    except AssertionError as error:
        reason = first_line(error) or "assertion failed: " + _failing_line(error, source, filename)
    except (Exception, SystemExit) as error:
        reason = type(error).__name__ + (": " + first_line(error) if first_line(error) else "")
    return False, reason


def _failing_line(error, source, filename):
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename == filename and frame.lineno:
            return source.splitlines()[frame.lineno - 1].strip()
    return "(unknown line)"
