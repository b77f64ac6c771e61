"""The `mpcourse` command's argument checks: each bad value is refused while the command line is
read, before any work, in one line that names the value and what is allowed.

Each check is an argparse `type`: it returns the value, or raises `ArgumentTypeError`, which
`Parser.error` prints as `mpcourse COMMAND: error: argument --NAME: WHY` and exits with status 2.
argparse runs a check on a string default too, so a default output path is checked as well.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

BAD_INPUT = 2  # the exit status of a command refused for its arguments


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line on stderr (no usage block), exit status 2.
    Its subparsers are of this class too (argparse makes them of the parent's class)."""

    def error(self, message: str):
        self.exit(BAD_INPUT, f"{self.prog}: error: {one_line(message)}\n")


def one_line(message) -> str:
    """`message` on one line: a multi-line explanation's lines joined."""
    return " ".join(str(message).split())


def at_least(low: int):
    """An integer check: whole numbers from `low` up."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number "
                                             f"(allowed: {low} or more)") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small (allowed: {low} or more)")
        return value
    check.__name__ = f"whole number of at least {low}"
    return check


def _number(text: str, allowed: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (allowed: {allowed})") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not finite (allowed: {allowed})")
    return value


def positive(text: str) -> float:
    """A number check: finite and above 0."""
    value = _number(text, "a finite number above 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not positive (allowed: a finite number above 0)")
    return value


def not_negative(text: str) -> float:
    """A number check: finite, 0 or more."""
    value = _number(text, "a finite number, 0 or more")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value:g} is negative (allowed: a finite number, 0 or more)")
    return value


def existing_file(text: str) -> str:
    """A path check: a file that exists."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder (allowed: an existing file)")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no file {text!r} (allowed: an existing file)")
    return text


def existing_folder(text: str) -> str:
    """A path check: a folder that exists."""
    if not Path(text).is_dir():
        what = "is a file" if Path(text).exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"the folder {text!r} {what} (allowed: an existing folder)")
    return text


def solutions_folder(text: str) -> str:
    """A path check: a folder holding solution notebooks (ex*.ipynb)."""
    existing_folder(text)
    if not any(Path(text).glob("ex*.ipynb")):
        raise argparse.ArgumentTypeError(f"no solution notebooks (ex*.ipynb) in {text!r} "
                                         "(allowed: a folder of solutions, as the course's solutions/)")
    return text


def _writable_ancestor(path: Path, text: str, what: str) -> None:
    """The nearest folder above `path` that exists must be a folder this user may write in."""
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} lies under {str(ancestor)!r}, which is a file "
                                         f"(allowed: {what})")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {str(ancestor)!r} to make {text!r} "
                                         f"(allowed: {what})")


def output_file(text: str) -> str:
    """A path check for a file to write (its missing folders are made): not a folder, writable."""
    path, allowed = Path(text), "a file path in a folder you may write in"
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder (allowed: {allowed})")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r} (allowed: {allowed})")
    _writable_ancestor(path, text, allowed)
    return text


def output_file_in_existing_folder(text: str) -> str:
    """A path check for a file to write whose folder must exist already (no folder is made)."""
    output_file(text)
    folder = Path(text).absolute().parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {str(folder)!r} does not exist (allowed: a file "
                                         "path in an existing folder; create the folder first)")
    return text


def output_folder(text: str) -> str:
    """A path check for a folder to write into (made if missing): not a file, writable."""
    path, allowed = Path(text), "a folder you may write in, or one to make there"
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file (allowed: {allowed})")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {text!r} (allowed: {allowed})")
    _writable_ancestor(path, text, allowed)
    return text


def with_suffix(check, *suffixes: str):
    """`check`, and the path must end in one of `suffixes` (".zip")."""
    def suffixed(text: str) -> str:
        if Path(text).suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text!r} does not end in {' or '.join(suffixes)} "
                                             f"(allowed: a {' or '.join(suffixes)} file)")
        return check(text)
    suffixed.__name__ = check.__name__
    return suffixed
