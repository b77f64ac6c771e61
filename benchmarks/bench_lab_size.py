"""The lab's size on this machine, and how much faster bf16 trains than fp32 at that size.

1. The calibration (`hardware.probe_matmuls`) and the decision it leads to (`lab_size`).
2. One training step at the chosen size, fp32 against bf16 autocast, timed in alternation
   (`benchmark.compare`): the tokens/s ratio that lesson 06 and `mpcourse compare` show. Where
   bf16 is accelerated the lab is sized so that this ratio is clearly above 1 (issue 14: at
   least 1.5x); where it is emulated the lab stays small and bf16 loses.
3. With `--record`, whole runs of fp32 and bf16 at `LESSON_CPU_MATMUL_CONFIG` (three of each,
   alternating, median tokens/s), printed as the `REFERENCE` to store in mpcourse/train/sizing.py.
   Record it on a machine that accelerates bf16, with the threads the lesson uses (`--threads 1`).

    python benchmarks/bench_lab_size.py [--threads N] [--record]
"""
import argparse
import dataclasses
import datetime
import os
import statistics
import warnings

import torch

from mpcourse.machine import hardware
from mpcourse.machine.benchmark import compare
from mpcourse.train.sizing import lab_size
from mpcourse.train import LESSON_CPU_MATMUL_CONFIG, train

from bench_train import one_step  # benchmarks/ is on the path when a benchmark runs as a script


def measured_config(config) -> str:
    """`config` as source: RunConfig(...) with the fields that differ from RunConfig's defaults."""
    changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if getattr(config, f.name) != f.default}
    return "RunConfig(" + ", ".join(f"{name}={value!r}" for name, value in changed.items()) + ")"


def record(config):
    """Whole runs of fp32 and bf16, alternating; the REFERENCE entry as Python source."""
    runs = {"fp32": [], "bf16": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            for precision in runs:
                runs[precision].append(train(dataclasses.replace(config, precision=precision,
                                                                 loss_scaling="off", device="cpu")))
    probe = hardware.probe_matmuls()
    report = hardware.report()
    bf16 = report.precisions["bf16"]
    machine = (f"{report.device_name} with {bf16.how if bf16.accelerated else 'emulated bf16'}, "
               f"{os.cpu_count()} cores, {torch.get_num_threads()} thread"
               f"{'s' if torch.get_num_threads() > 1 else ''}, torch {torch.__version__}")
    lines = ["REFERENCE = ReferenceMeasurement(",
             f"    machine={machine!r},",
             f"    date={datetime.date.today().isoformat()!r},",
             f"    config={measured_config(config)},   # what was measured, spelled out",
             f"    matmul_n={probe.n},",
             f"    matmul_speedups={{'bf16': {probe.speedup('bf16'):.2f}, 'fp16': {probe.speedup('fp16'):.3f}}},",
             "    runs=("]
    for precision, results in runs.items():
        speed = statistics.median(r.tokens_per_s for r in results)
        r = results[0]
        lines.append(f"        ReferenceRun({precision!r}, tokens_per_s={speed:.0f}, "
                     f"eval_loss={r.eval_loss:.4f}, peak_memory_bytes={r.peak_memory_bytes}),")
    lines.append("    ),\n)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--record", action="store_true", help="also print a REFERENCE to store")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    report = hardware.report()
    print(f"{report.device_name}, {torch.get_num_threads()} threads, vector ISA {report.cpu_capability}")
    probe = hardware.measured_probe()
    print(f"1. calibration, a {probe.n}x{probe.n} matmul against fp32: "
          + ", ".join(f"{p} {probe.speedup(p):.2f}x" for p in ("bf16", "fp16")))
    size = lab_size("cpu")
    config = size.config
    print(f"   the lab's size: d_model {config.d_model}, {config.n_layers} layers, batch "
          f"{config.batch_size} x {config.seq_len}\n   because: {size.reason}")

    result = compare(one_step(None, config), one_step(torch.bfloat16, config), name_a="fp32",
                     name_b="bf16 autocast", warmup=2, repeats=7)
    tokens = config.batch_size * config.seq_len
    print(f"\n2. one training step at that size\n   {result}")
    print(f"   fp32 {tokens / result.seconds_a:,.0f} tokens/s, bf16 {tokens / result.seconds_b:,.0f} "
          f"tokens/s: bf16 runs at {1 / result.ratio:.2f}x fp32's tokens/s")
    if args.record:
        print(f"\n3. whole runs at LESSON_CPU_MATMUL_CONFIG, to store in mpcourse/train/sizing.py:\n"
              f"{record(LESSON_CPU_MATMUL_CONFIG)}")


if __name__ == "__main__":
    main()
