"""The lab's comparison at GPU size (GPT-2 small's shape): tokens/s, speed-up, MFU, peak memory.

    .venv/bin/python benchmarks/gpu_check.py            # needs a CUDA GPU
    .venv/bin/python benchmarks/gpu_check.py --smoke    # a tiny run of the same code, any device

On a GPU it runs at the lab's size for that GPU (`mpcourse.train.sizing`: the batch that fits its
memory) every precision the GPU can run, and prints a dated table to paste into the README and
lesson 06. Peaks come from the GPU class's datasheet figures in `mpcourse.machine.gpus`.

Precisions: fp32 with TF32 off (the baseline), tf32, bf16 autocast, fp16 autocast with dynamic
loss scaling. MFU (model FLOPs utilisation) is the model's training FLOPs per second,
6 * parameters + attention per token (`GPT.flops_per_token`), divided by the GPU's dense peak
for that precision. Target on an H100/H200: bf16 at least 3x fp32's tokens/s.
"""
import argparse
import dataclasses
import datetime
import sys

import torch

from mpcourse.machine import gpus, hardware
from mpcourse.train.sizing import lab_size
from mpcourse.train.models import GPT
from mpcourse.numbers.precision import RUN_PRECISIONS
from mpcourse.train import LESSON_CPU_CONFIG, train
from mpcourse.views.runs import RunComparison


def peak_flops(device_name: str) -> dict[str, float] | None:
    """The GPU class's dense datasheet peaks (mpcourse.machine.gpus), or None for a GPU not in its table."""
    gpu = gpus.identify(device_name)
    return gpu.device.peak_flops if gpu else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="run a tiny size on whatever device there is (checks the script, measures nothing)")
    parser.add_argument("--steps", type=int, default=None, help="steps per precision")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu_check needs a CUDA GPU and this machine has none (torch.cuda.is_available() is "
              "False). Its numbers mean something only on a GPU; run with --smoke to check the "
              "script at a tiny size here.", file=sys.stderr)
        return 2
    # On a GPU: the lab's size for it (GPT-2 small's shape, the batch that fits its memory) and every
    # precision it can run; a T4 has no TF32, and its bf16 runs emulated (shown, marked).
    base = lab_size("cuda").config if not args.smoke else dataclasses.replace(LESSON_CPU_CONFIG, steps=6)
    if args.steps:
        base = dataclasses.replace(base, steps=args.steps)
    runnable = hardware.report().precisions
    configs = [dataclasses.replace(base, precision=p, loss_scaling="dynamic" if p == "fp16" else "off")
               for p in RUN_PRECISIONS if runnable[p].supported or p == "tf32" and args.smoke]
    device = configs[0].resolved_device()
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    model = GPT(base.model_config())
    print(f"{datetime.date.today().isoformat()}, {name}; torch {torch.__version__}; model: {model.num_parameters() / 1e6:.1f}M parameters, "
          f"d_model {base.d_model}, {base.n_layers} layers, batch {base.batch_size} x {base.seq_len} tokens, "
          f"{base.steps} steps ({base.warmup_steps} warm-up)")
    results = [train(config) for config in configs]
    print(RunComparison(results))
    peaks = peak_flops(name) if device.type == "cuda" else None
    fp32 = results[0].tokens_per_s
    for r in results:
        achieved = r.tokens_per_s * model.flops_per_token()
        peak = peaks.get(r.config.precision) if peaks else None
        mfu = f"{achieved / peak:.1%}" if peak else "n/a (no peak)"
        print(f"{r.config.precision:>5}: {r.tokens_per_s:>12,.0f} tokens/s  {r.tokens_per_s / fp32:5.2f}x fp32  "
              f"{achieved / 1e12:8.2f} TFLOP/s  MFU {mfu:>18}  peak memory {r.peak_memory_bytes / 2**30:6.2f} GiB")
    bf16 = next(r for r in results if r.config.precision == "bf16")
    print(f"bf16 / fp32 (TF32 off) = {bf16.tokens_per_s / fp32:.2f}x (target on H100/H200-class: >= 3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
