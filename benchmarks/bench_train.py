"""Lesson 06's training step: bf16 autocast against fp32, and the library loop against a bare one.

1. One training step of the lab's CPU configuration in fp32 and under bf16 autocast, as tokens/s.
   Whether bf16 wins depends on the CPU: with AVX512-BF16 or AMX the matmuls run in bf16
   hardware (a comparable model ran ~1.6x faster); without them bf16 is emulated and slower.
2. `mpcourse.train.train` against the same run written by hand in plain torch (same data,
   model, AdamW, GradScaler, clipping): the price of the library's bookkeeping, timing,
   callbacks and first-step memory accounting. Target: at most 5%.
"""
import dataclasses
import math

import torch

from mpcourse.machine import hardware
from mpcourse.machine.benchmark import compare
from mpcourse.train.data import Batches, MarkovText
from mpcourse.train.models import GPT, next_token_loss
from mpcourse.train import LESSON_CPU_CONFIG, train

CONFIG = dataclasses.replace(LESSON_CPU_CONFIG, device="cpu")


def one_step(dtype, config=CONFIG):
    """A function running one AdamW training step of `config` under autocast to `dtype` (None: fp32)."""
    torch.manual_seed(0)
    model = GPT(config.model_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    x, y = Batches(MarkovText(config.vocab_size), config.batch_size, config.seq_len).get(0)

    def step():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = next_token_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return step


def bare_run(config):
    """The whole fp32 run by hand: what `train(config)` does, minus the library."""
    torch.manual_seed(config.seed)
    text = MarkovText(config.vocab_size, seed=config.seed)
    batches = Batches(text, config.batch_size, config.seq_len, seed=config.seed)
    evaluation = Batches(text, config.batch_size, config.seq_len, seed=config.seed + 1)
    model = GPT(config.model_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=config.init_scale)
    losses = []
    for step in range(config.steps):
        x, y = batches.get(step)
        loss = next_token_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        eval_losses = [next_token_loss(model(x), y).item()
                       for x, y in map(evaluation.get, range(config.eval_batches))]
    return losses, sum(eval_losses) / len(eval_losses)


def main():
    report = hardware.report()
    bf16 = report.precisions["bf16"]
    print(f"{report.device_name}, {report.threads} threads, vector ISA {report.cpu_capability}")
    print(f"bf16 here: accelerated={bf16.accelerated} ({bf16.how})")
    tokens = CONFIG.batch_size * CONFIG.seq_len
    print(f"\n1. One training step, d_model={CONFIG.d_model}, {CONFIG.n_layers} layers, "
          f"batch {CONFIG.batch_size} x {CONFIG.seq_len} tokens")
    result = compare(one_step(None), one_step(torch.bfloat16), name_a="fp32", name_b="bf16 autocast",
                     warmup=3, repeats=11)
    print(result)
    print(f"fp32 {tokens / result.seconds_a:,.0f} tokens/s, bf16 {tokens / result.seconds_b:,.0f} "
          f"tokens/s: bf16 is {1 / result.ratio:.2f}x fp32's throughput")

    config = dataclasses.replace(CONFIG, steps=30)
    library = train(config)
    bare_losses, bare_eval = bare_run(config)
    assert (library.losses, library.eval_loss) == (bare_losses, bare_eval), "the loops must do the same work"
    print(f"\n2. A whole fp32 run of {config.steps} steps (setup, steps, evaluation)")
    result = compare(lambda: bare_run(config), lambda: train(config), name_a="bare torch loop",
                     name_b="mpcourse.train", warmup=1, repeats=5)
    print(result)
    overhead = result.ratio - 1
    print(f"library overhead: {overhead:+.1%} (target: at most +5%)"
          + ("" if overhead <= 0.05 else "  ABOVE TARGET (the machine may be busy: rerun)"))
    assert math.isfinite(overhead)


if __name__ == "__main__":
    main()
