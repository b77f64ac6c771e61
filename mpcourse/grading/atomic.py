"""One way to write a file that a reader sees whole or not at all.

Every gradebook, LMS import, report, feedback file and Gradescope results.json goes through
`write_atomically`: the bytes go to a temporary file in the same folder, are flushed to disk,
and the temporary file is renamed over the target. A reader (an LMS upload, Gradescope reading
results.json after a kill) finds either the previous file or the complete new one.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> Path:
    """Write `data` (text as UTF-8) to `path` in one step, with permissions `mode`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
