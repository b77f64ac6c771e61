"""One training step of lesson 03's transformer under mpcourse.amp.autocast against torch.autocast (CPU).

mpcourse.amp.autocast makes its casting decisions in Python, once per op call, so it costs some
microseconds per op on top of the same kernels torch runs. On a model whose ops do real work that
overhead should stay small: the target is a ratio of at most 1.2 (issue 17).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import mpcourse
from mpcourse.machine.benchmark import compare
from mpcourse.machine.hardware import report

VOCAB, D_MODEL, HEADS, LAYERS, BATCH, SEQ = 256, 128, 4, 2, 8, 32


def lesson_model() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0,
                                         batch_first=True, norm_first=True) for _ in range(LAYERS)]
    return nn.Sequential(nn.Embedding(VOCAB, D_MODEL), *layers, nn.LayerNorm(D_MODEL),
                         nn.Linear(D_MODEL, VOCAB))


def training_step(model, optimizer, region, tokens, targets):
    optimizer.zero_grad(set_to_none=True)
    with region():
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    optimizer.step()


def main() -> None:
    model = lesson_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    result = compare(
        lambda: training_step(model, optimizer, lambda: torch.autocast("cpu", dtype=torch.bfloat16),
                              tokens, targets),
        lambda: training_step(model, optimizer, lambda: mpcourse.amp.autocast("cpu", dtype=torch.bfloat16),
                              tokens, targets),
        name_a="torch.autocast", name_b="mpcourse.amp.autocast", warmup=1, repeats=7)
    print(f"one bf16 training step, {LAYERS}-layer transformer (d={D_MODEL}, batch {BATCH}x{SEQ}), "
          f"{torch.get_num_threads()} threads")
    print(f"bf16 on this machine: {report().precisions['bf16'].how}")
    print(result)
    print(f"target ratio <= 1.2: {'met' if result.ratio <= 1.2 else 'NOT met'}")


if __name__ == "__main__":
    main()
