"""How long each notebook takes to execute on this machine, top to bottom in a fresh kernel.

This is the time `make notebooks` spends per notebook (nbval runs the same way): a kernel's
start, every cell, the shutdown. It prints each lesson and solution, its slowest cell, and the
totals next to the course's target: all lessons together in at most 5 minutes on 2 CPU cores.
Run it on an otherwise idle machine; other processes on the same cores slow every number.

    .venv/bin/python benchmarks/bench_notebooks.py [notebooks/01_formats.ipynb ...]
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
LESSON_TARGET_S = 300


def cell_seconds(cell) -> float:
    """Seconds between the kernel receiving a cell and its reply, from nbclient's timing record."""
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def execute(path: Path) -> tuple[float, int, float]:
    """Run the notebook in a fresh kernel; return total seconds, slowest code cell, its seconds."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute(stderr=subprocess.DEVNULL)   # the kernel process's start-up chatter; cell errors still raise
    total = time.perf_counter() - start
    code = [c for c in nb.cells if c.cell_type == "code"]
    seconds = [cell_seconds(c) for c in code]
    slowest = max(range(len(code)), key=seconds.__getitem__) if code else -1
    return total, slowest, seconds[slowest] if code else 0.0


def main(paths: list[Path]) -> None:
    print(f"{os.cpu_count()} CPU cores; each notebook in a fresh kernel, as nbval runs it\n")
    print(f"{'notebook':<42}{'seconds':>9}   slowest code cell")
    totals: dict[str, float] = {}
    for path in paths:
        total, slowest, slowest_s = execute(path)
        folder = path.parent.name
        totals[folder] = totals.get(folder, 0.0) + total
        print(f"{folder + '/' + path.name:<42}{total:9.1f}   cell {slowest}: {slowest_s:.1f} s", flush=True)
    print()
    for folder, total in totals.items():
        verdict = ""
        if folder == "notebooks":
            verdict = (f"  (target {LESSON_TARGET_S} s: "
                       f"{'within' if total <= LESSON_TARGET_S else 'OVER'} it)")
        print(f"{folder + '/ total':<42}{total:9.1f}{verdict}")
    print(f"{'all':<42}{sum(totals.values()):9.1f}")


if __name__ == "__main__":
    given = [Path(p).resolve() for p in sys.argv[1:]]
    main(given or sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb")))
