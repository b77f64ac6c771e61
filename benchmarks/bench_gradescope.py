"""What one Gradescope submission costs: run_autograder in a simulated /autograder, per exercise.

For each exercise: build its autograder zip, lay out Gradescope's folders in a temporary root,
and run `run_autograder` on the solution (the most work a submission does: every test passes, so
every test runs to its end). Each container does everything once: load the tests, run the
solution to plan them (the reference run), then grade. Printed per exercise: wall seconds, CPU
seconds of run_autograder and everything it started, and the peak of their summed resident
memory (sampled every 50 ms), beside Gradescope's defaults (0.5 vCPU, 768 MB, 10 minutes;
gradescope/autograder_samples docs/troubleshooting.md). On 0.5 vCPU a run takes at least twice
its CPU seconds. Timings depend on this machine's load, which is printed: they are not a claim
about an idle machine.

    .venv/bin/python benchmarks/bench_gradescope.py [ex00 ex06 ...]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
sys.path.insert(0, str(ROOT))
from mpcourse.grading.judging.exercise import find_solutions  # noqa: E402
from mpcourse.grading.platforms.gradescope_zip import build_autograder  # noqa: E402


def descendants(pid: int) -> tuple[int, dict[int, float]]:
    """Summed resident bytes of `pid` and every process below it, and each one's CPU seconds so far.

    CPU is read from /proc while the processes live: a sandbox's processes die with its PID
    namespace and are never waited for, so the kernel's children accounting misses them.
    """
    children, stats = {}, {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(status.parent.name))
            stats[int(status.parent.name)] = (int(fields[11]) + int(fields[12])) / TICKS
        except (OSError, IndexError, ValueError):
            continue
    todo, rss, cpu = [pid], 0, {}
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        cpu[current] = stats.get(current, 0.0)
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) << 10
        except OSError:
            pass
    return rss, cpu


def measure(exercise: str, folder: Path) -> tuple[float, float, int, str]:
    root = folder / exercise / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "results").mkdir()
    out = folder / f"{exercise}.zip"
    build_autograder(ROOT / "solutions", out, [exercise])
    with zipfile.ZipFile(out) as zf:
        zf.extractall(root / "source")
    os.chmod(root / "source" / "run_autograder", 0o755)
    shutil.copy(ROOT / "solutions" / f"{exercise}.ipynb", root / "submission")
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), MPCOURSE_PYTHON=sys.executable)
    start = time.perf_counter()
    process = subprocess.Popen([str(root / "source" / "run_autograder")], env=env, cwd=root,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak, seconds = [0], {}

    def sample():
        while process.poll() is None:
            rss, cpu = descendants(process.pid)
            peak[0] = max(peak[0], rss)
            seconds.update(cpu)
            time.sleep(0.05)
    sampler = threading.Thread(target=sample)
    sampler.start()
    output = process.communicate()[0].decode(errors="replace")
    sampler.join()
    wall = time.perf_counter() - start
    cpu = sum(seconds.values())
    score = next((line.split(f"[{exercise}]")[1].split()[0] for line in output.splitlines()
                  if f"[{exercise}]" in line), "?")
    return wall, cpu, peak[0], score


def main() -> None:
    wanted = sys.argv[1:] or [path.stem for path in find_solutions(ROOT / "solutions").values()]
    names = {p.stem[:4]: p.stem for p in (ROOT / "solutions").glob("ex*.ipynb")}
    exercises = [names.get(w, w) for w in wanted]
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'exercise':<28}{'score':>8}{'wall s':>9}{'CPU s':>8}{'peak RSS MB':>13}{'>= wall at 0.5 vCPU':>21}")
    with tempfile.TemporaryDirectory() as folder:
        for exercise in exercises:
            wall, cpu, peak, score = measure(exercise, Path(folder))
            print(f"{exercise:<28}{score:>8}{wall:>9.1f}{cpu:>8.1f}{peak / 1e6:>13.0f}{2 * cpu:>20.0f}s", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
