"""The clinic's record of one case, and the pieces every reproduction is built from.

A case function makes the mistake on a tiny model, measures the symptom, applies the fix and
measures again; it returns `diagnosed(number, WORDS, before, after, evidence)`: its words (title,
symptom, cause, fix, references), written as plain text above the function, with the numbers it
measured. The other pieces here are the ones the cases share: a seeded block, seeded regression
data, a small MLP, and one loss-scaled step that says whether the scaler skipped it.
"""
from __future__ import annotations

import contextlib
import textwrap
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Case:
    """One clinic case: what the learner sees, why, the fix, and the numbers measured for both."""
    number: int
    title: str
    symptom: str
    cause: str
    fix: str
    references: tuple[str, ...]
    before: dict[str, Any]  # measured with the mistake in place
    after: dict[str, Any]   # measured with the fix applied
    evidence: str           # one line built from `before` and `after`

    def __str__(self) -> str:
        lines = [f"Case {self.number}: {self.title}", f"  symptom : {self.symptom}",
                 f"  cause   : {self.cause}", f"  fix     : {self.fix}",
                 f"  measured: {self.evidence}"]
        return "\n".join(lines)


FIELDS = ("symptom", "cause", "fix", "references")


def diagnosed(number: int, words: str, before: dict[str, Any], after: dict[str, Any],
              evidence: str, **values: Any) -> Case:
    """Case `number`, its words read from `words` and its numbers from `before` and `after`.

    `words` is the diagnosis as a reader would write it: the title on the first line, then
    one line each starting `symptom:`, `cause:`, `fix:` and `references:` (separated by "; "),
    continued on indented lines. `values` fill its {placeholders}, e.g. a dtype in the title.
    """
    lines = textwrap.dedent(words.format(**values) if values else words).strip().splitlines()
    fields: dict[str, str] = {}
    key = None
    for line in lines[1:]:
        if line.startswith((" ", "\t")) and key is not None:
            fields[key] += " " + line.strip()
            continue
        key, _, text = line.partition(": ")
        if key not in FIELDS or key in fields:
            raise ValueError(f"case {number}: expected one line for each of {FIELDS}, got {line!r}")
        fields[key] = text.strip()
    if set(fields) != set(FIELDS):
        raise ValueError(f"case {number}: missing {sorted(set(FIELDS) - set(fields))} in its words")
    return Case(number, lines[0].strip(), fields["symptom"], fields["cause"], fields["fix"],
                tuple(fields["references"].split("; ")), before, after, evidence)


@contextlib.contextmanager
def seeded(seed: int):
    """Seed torch's global generator for the block, then restore whatever state it had."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def regression_data(n_in: int, n_out: int, batch: int, seed: int,
                    target_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs (batch, n_in) and targets (batch, n_out) times `target_scale`, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n_in, generator=g)
    y = target_scale * torch.randn(batch, n_out, generator=g)
    return x, y


def tiny_mlp(dtype: torch.dtype = torch.float32, seed: int = 4) -> nn.Module:
    """Linear(8, 16) -> Tanh -> Linear(16, 4), initialised from `seed`, in `dtype`."""
    with seeded(seed):
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(dtype)


def scaled_step(scaler: Any, optimizer: Any, loss: torch.Tensor) -> bool:
    """Backward `loss` through `scaler`, step and update; True when the scaler skipped the step.

    A dynamic scaler lowers its scale exactly when it skipped the step for an inf or NaN.
    """
    scaler.scale(loss).backward()
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() < before
