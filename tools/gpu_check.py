"""`make gpu-check`: the course on a machine with a CUDA GPU, checked in one run, with a dated record.

Usage: python tools/gpu_check.py [--smoke] [--out DIR] [--notebooks DIR] [--lessons NN ...]

1. `benchmarks/gpu_check.py --json`: the lab at the GPU's size, every precision it runs, with
   tokens/s, the speed-ups against fp32 and tf32, and MFU against the GPU class's datasheet;
2. every lesson under nbval in strict mode (`make test`'s flags), each at its GPU size, which
   `hardware.scaled` chooses by itself where CUDA is present;
3. a JSON file, `DIR/<date>-<device>.json` (default results/gpu/, to commit): the device, torch,
   CUDA, cuDNN and cuBLAS versions, each lesson's verdict and seconds, and the lab's rows.

The whole run is meant to fit `BUDGET_S` (8 minutes) on one H100: the benchmark gets
`BENCHMARK_S`, and each lesson an equal share of the rest, after which it counts as failed
("over its budget"). The lab's stored reference (lesson 06, README) is replaced only from such a
record. `--smoke` checks this script on any machine, a CPU included: the benchmark at a tiny size,
no lesson unless `--lessons` names some, and a record named and marked as a smoke run, written
under build/gpu-check/ (ignored by git).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 480.0
BENCHMARK_S = 90.0
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with",
         str(ROOT / "tests" / "nbval_sanitize.cfg")]


def versions() -> dict[str, str | None]:
    """torch, CUDA, cuDNN and cuBLAS as this process sees them (None where there is none)."""
    import torch
    cublas = sorted(f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
                    if d.metadata["Name"].lower().startswith("nvidia-cublas"))
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": str(torch.backends.cudnn.version()) if cuda else None,
            "cublas": ", ".join(cublas) or None,
            "device": torch.cuda.get_device_name(0) if cuda else "CPU",
            "capability": "sm_{}{}".format(*torch.cuda.get_device_capability(0)) if cuda else None}


def benchmark(smoke: bool, timeout_s: float) -> dict:
    """benchmarks/gpu_check.py's JSON, or {"error": ...} when it failed or ran out of time."""
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--json"]
    command += ["--smoke"] if smoke else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"over its budget of {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-2000:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def lesson(notebook: Path, timeout_s: float) -> dict:
    """One notebook under nbval: "passed", "failed" or "over its budget", and the seconds."""
    start = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NBVAL, str(notebook)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        verdict = "passed" if done.returncode == 0 else "failed"
        tail = "" if done.returncode == 0 else done.stdout.strip()[-1500:]
    except subprocess.TimeoutExpired:
        verdict, tail = "over its budget", f"stopped after {timeout_s:.0f} s"
    return {"notebook": notebook.name, "verdict": verdict, "seconds": round(time.monotonic() - start, 1),
            "budget_s": round(timeout_s), "detail": tail}


def chosen_notebooks(folder: Path, lessons: list[str] | None, smoke: bool) -> tuple[list[Path], list[str]]:
    """The notebooks to run, and the names of those skipped (all of them in a smoke run without
    --lessons)."""
    every = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    wanted = [p for p in every if (lessons is None and not smoke) or (lessons and p.name[:2] in lessons)]
    return wanted, [p.name for p in every if p not in wanted]


def record_path(out: Path, device: str, smoke: bool) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return out / f"{datetime.date.today().isoformat()}-{slug}{'-smoke' if smoke else ''}.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="check the script at a tiny size, on any machine")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the record goes (results/gpu; a smoke run's: build/gpu-check, not kept)")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks", help="the lessons' folder")
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="only these lessons (e.g. 00 06)")
    args = parser.parse_args(argv)
    if args.lessons and not all(re.fullmatch(r"\d\d", n) for n in args.lessons):
        parser.error(f"--lessons takes two-digit lesson numbers (00 to 11), got {' '.join(args.lessons)}")
    about = versions()
    if about["device"] == "CPU" and not args.smoke:
        print("gpu-check needs a CUDA GPU and this machine has none; `make gpu-check SMOKE=1` "
              "checks the script here", file=sys.stderr)
        return 2
    started = time.monotonic()
    lab = benchmark(args.smoke, BENCHMARK_S)
    notebooks, skipped = chosen_notebooks(args.notebooks, args.lessons, args.smoke)
    share = (BUDGET_S - BENCHMARK_S) / max(len(notebooks), 1)
    results = [lesson(notebook, share) for notebook in notebooks]
    record = {"smoke": args.smoke, "date": datetime.date.today().isoformat(), **about,
              "seconds": round(time.monotonic() - started, 1), "budget_s": BUDGET_S, "lab": lab,
              "lessons": results,
              "skipped": {name: "smoke run: checks the script only" if args.smoke else "not chosen"
                          for name in skipped}}
    out = args.out or ROOT / ("build/gpu-check" if args.smoke else "results/gpu")
    path = record_path(out, about["device"], args.smoke)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(summary(record, path))
    ok = "error" not in lab and all(r["verdict"] == "passed" for r in results)
    return 0 if ok else 1


def summary(record: dict, path: Path) -> str:
    """The record in a few lines: what ran, the lab's speed-ups and MFU, each lesson's verdict."""
    kind = "SMOKE RUN (tiny sizes, nothing measured)" if record["smoke"] else "GPU check"
    lines = [f"{kind}: {record['device']}, torch {record['torch']}, CUDA {record['cuda']}, "
             f"cuBLAS {record['cublas']}; {record['seconds']:.0f} s of a {record['budget_s']:.0f} s budget"]
    lab = record["lab"]
    if "error" in lab:
        lines.append(f"  lab benchmark: FAILED, {lab['error']}")
    for row in lab.get("rows", []):
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a"
        vs_tf32 = f"{row['vs_tf32']:.2f}x" if row["vs_tf32"] is not None else "n/a"
        lines.append(f"  {row['precision']:>5}: {row['tokens_per_s']:>12,.0f} tokens/s, "
                     f"{row['vs_fp32']:.2f}x fp32, {vs_tf32} tf32, MFU {mfu}")
    lines += [f"  {r['notebook']:<34}{r['verdict']:<17}{r['seconds']:6.0f} s of {r['budget_s']} s"
              for r in record["lessons"]]
    lines += [f"  {name:<34}skipped: {why}" for name, why in record["skipped"].items()]
    lines.append(f"record: {path}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
