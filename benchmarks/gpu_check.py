"""The lab's comparison at GPU size (GPT-2 small's shape): tokens/s, speed-ups, MFU, peak memory.

    .venv/bin/python benchmarks/gpu_check.py            # needs a CUDA GPU
    .venv/bin/python benchmarks/gpu_check.py --smoke    # a tiny run of the same code, any device
    .venv/bin/python benchmarks/gpu_check.py --json     # the rows as JSON (tools/gpu_check.py)

On a GPU it runs, at the lab's size for that GPU (`mpcourse.train.sizing`: the batch that fits
its memory), every precision the GPU can run, and prints a dated table to paste into the README
and lesson 06.

Precisions: fp32 with TF32 off, tf32 (FP32 matmuls on TF32 tensor cores, from Ampere on), bf16
autocast, fp16 autocast with dynamic loss scaling. Every row gives its speed-up against both FP32
baselines: TF32 off is the strict one, TF32 is what FP32 training gets on Ampere and newer once
allowed, so it is the honest one there. MFU (model FLOPs utilisation) is tokens/s times the
training FLOPs per token (`mpcourse.machine.performance.gpt_training_flops`, causal attention)
over the GPU class's dense datasheet peak for that precision (`GpuClass.mfu`); a GPU not in the
table of `mpcourse.machine.gpus` gets its measured figures and no MFU. Target on an H100/H200:
bf16 at least 3x fp32's tokens/s.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys

import torch

from mpcourse.machine import gpus, hardware
from mpcourse.machine.performance import gpt_training_flops
from mpcourse.numbers.precision import RUN_PRECISIONS
from mpcourse.train import LESSON_CPU_CONFIG, RunConfig, train
from mpcourse.train.sizing import lab_size


@dataclasses.dataclass(frozen=True)
class Row:
    """One precision's run: its speed, its speed-ups over both FP32 baselines, MFU and memory."""
    precision: str
    tokens_per_s: float
    vs_fp32: float
    vs_tf32: float | None          # None without a TF32 run (a T4, a CPU outside --smoke)
    tflops: float                  # model FLOPs achieved per second, in TFLOP/s
    mfu: float | None              # None without a datasheet peak for this precision
    peak_memory_gib: float
    accelerated: bool


def runs(base: RunConfig, runnable: dict, smoke: bool) -> list[RunConfig]:
    """The precisions this device runs (all four in --smoke, where only the code is checked)."""
    return [dataclasses.replace(base, precision=p, loss_scaling="dynamic" if p == "fp16" else "off")
            for p in RUN_PRECISIONS if smoke or runnable[p].supported]


def rows(results, gpu: gpus.GpuClass | None, flops_per_token: int) -> list[Row]:
    """The table's rows from the runs' results; MFU against `gpu`'s datasheet, where known."""
    speed = {r.config.precision: r.tokens_per_s for r in results}
    table = []
    for r in results:
        achieved = r.tokens_per_s * flops_per_token
        table.append(Row(r.config.precision, r.tokens_per_s, r.tokens_per_s / speed["fp32"],
                         r.tokens_per_s / speed["tf32"] if "tf32" in speed else None,
                         achieved / 1e12, gpu.mfu(achieved, r.config.precision) if gpu else None,
                         r.peak_memory_bytes / 2**30, r.accelerated))
    return table


def format_rows(table: list[Row], no_mfu: str) -> str:
    """The rows as text; `no_mfu` says why a row has no MFU."""
    lines = [f"{'run':>5} {'tokens/s':>12} {'vs fp32':>8} {'vs tf32':>8} {'TFLOP/s':>8} {'MFU':>7} "
             f"{'peak GiB':>9}"]
    for r in table:
        vs_tf32 = f"{r.vs_tf32:7.2f}x" if r.vs_tf32 is not None else f"{'n/a':>8}"
        mfu = f"{r.mfu:7.1%}" if r.mfu is not None else f"{'n/a':>7}"
        emulated = "" if r.accelerated else "  (not accelerated here)"
        lines.append(f"{r.precision:>5} {r.tokens_per_s:>12,.0f} {r.vs_fp32:7.2f}x {vs_tf32} "
                     f"{r.tflops:8.2f} {mfu} {r.peak_memory_gib:9.2f}{emulated}")
    if any(r.mfu is None for r in table):
        lines.append(f"MFU n/a: {no_mfu}")
    return "\n".join(lines)


def _base(args) -> RunConfig:
    base = lab_size("cuda").config if not args.smoke else dataclasses.replace(LESSON_CPU_CONFIG, steps=6)
    return dataclasses.replace(base, steps=args.steps) if args.steps else base


def _device() -> tuple[str, gpus.GpuClass | None, str]:
    """This device's name, its class (None on a CPU or for a GPU not in the table) and why MFU
    is missing where it is."""
    if not torch.cuda.is_available():
        return "CPU", None, "a CPU run (--smoke) has no datasheet peak"
    name, capability = torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)
    gpu = gpus.identify(name)
    sm = f"sm_{capability[0]}{capability[1]}"
    why = (f"{name} ({sm}) is not in the table of mpcourse.machine.gpus: measured figures only"
           if gpu is None else f"{gpu.name}'s datasheet ({gpu.source.split(':')[0]}) lists no peak "
           "for that precision")
    return name, gpu, why


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny size on whatever device there is (checks the script, measures nothing)")
    parser.add_argument("--steps", type=int, default=None, help="steps per precision")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu_check needs a CUDA GPU and this machine has none (torch.cuda.is_available() is "
              "False). Its numbers mean something only on a GPU; run with --smoke to check the "
              "script at a tiny size here.", file=sys.stderr)
        return 2
    base = _base(args)
    name, gpu, no_mfu = _device()
    runnable = hardware.report().precisions
    results = [train(config) for config in runs(base, runnable, args.smoke)]
    flops = gpt_training_flops(base.n_layers, base.d_model, base.seq_len, base.vocab_size)
    table = rows(results, gpu, flops)
    if args.json:
        print(json.dumps({"date": datetime.date.today().isoformat(), "device": name, "smoke": args.smoke,
                          "gpu_class": gpu.name if gpu else None, "flops_per_token": flops,
                          "config": dataclasses.asdict(base),
                          "rows": [dataclasses.asdict(r) for r in table]}))
        return 0
    print(f"{datetime.date.today().isoformat()}, {name}; torch {torch.__version__}; d_model {base.d_model}, "
          f"{base.n_layers} layers, batch {base.batch_size} x {base.seq_len} tokens, {base.steps} steps "
          f"({base.warmup_steps} warm-up); {flops / 1e6:.1f} MFLOP per token (causal attention)")
    print(format_rows(table, no_mfu))
    for p in RUN_PRECISIONS:
        if p not in {r.precision for r in table}:
            print(f"{p}: not run here: {runnable[p].how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
