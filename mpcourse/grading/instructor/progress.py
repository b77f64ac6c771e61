"""What an instructor watches while `mpcourse grade` runs: a progress bar and JSON lines.

The bar (tqdm, on stderr) counts submissions done and left, with tqdm's estimate of the time
left, and names the slowest submission so far with its seconds. It is drawn only when stderr is
a terminal, so logs and pipes stay clean; a terminal that reports no size (a pty opened without
one, as `script` or `docker exec -t` can give) gets `shutil.get_terminal_size`'s, since tqdm
draws nothing on a terminal of 0 rows or columns. `--jsonl` prints one JSON object per submission on
stdout as each finishes, for scripts that watch a long run.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from mpcourse.grading.gradebook import SubmissionResult, clean


class Progress:
    """A bar over `total` submissions; `done(result)` moves it and keeps the slowest in view."""

    def __init__(self, total: int, stream=None, enabled: bool | None = None):
        stream = stream or sys.stderr
        if enabled is None:
            enabled = hasattr(stream, "isatty") and stream.isatty()
        size = _fixed_size(stream)
        self.bar = tqdm(total=total, file=stream, disable=not enabled, desc="grading", unit="notebook",
                        dynamic_ncols=size is None, ncols=size and size.columns, nrows=size and size.lines)
        self.slowest: SubmissionResult | None = None

    def done(self, result: SubmissionResult) -> None:
        if self.slowest is None or result.seconds > self.slowest.seconds:
            self.slowest = result
        where = Path(result.path)
        slowest = f"slowest {where.parent.name}/{where.name} {self.slowest.seconds:.1f} s"
        self.bar.set_postfix_str(clean(slowest if self.slowest is result else self.bar.postfix or ""),
                                 refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _fixed_size(stream) -> os.terminal_size | None:
    """The size to draw the bar for, or None to follow the terminal's size as it changes."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a terminal: tqdm draws without a width
        return None
    return None if size.columns > 0 and size.lines > 0 else shutil.get_terminal_size()


def json_line(index: int, result: SubmissionResult) -> str:
    """One submission as a line of `--jsonl`: its place in the command line, then its result."""
    return json.dumps({"index": index, **result.to_json()}, ensure_ascii=True)
