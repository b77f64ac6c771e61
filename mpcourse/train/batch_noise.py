"""How much a batch's loss moves just because the batches differ: the lab's yardstick (lesson 06).

Two batches of the Markov text hold different tokens, so even a model that knows the chain
exactly scores them differently. That sampling noise is the floor under every step-to-step
change of a training loss, and it shrinks with the tokens per batch as 1/sqrt(tokens): a
yardstick tuned at the CPU size (8 x 32 tokens) is about sqrt(32) times too wide at the GPU
size (8 x 1024). So lesson 06 derives its thresholds from `loss_noise(text, batch, seq_len)`,
computed exactly from the chain's transition table, instead of writing a number.
"""
from __future__ import annotations

import math

import torch

from mpcourse.train.data import MarkovText


def sequence_loss_moments(text: MarkovText, seq_len: int) -> tuple[float, float]:
    """The mean and variance of one sequence's summed loss, `seq_len` predictions, for a model
    that knows the chain: each token costs -ln p(token | previous).

    Exact, by a forward pass over the chain (as `MarkovText.sample` draws it: a uniform first
    token, then `seq_len` transitions): for every state s it carries P(x_t = s) and the first
    and second moments of the loss so far on {x_t = s}, which a transition updates in closed form.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    p = text.transition
    cost = torch.where(p > 0, -p.log(), 0.0)
    cost_p, cost2_p = cost * p, cost**2 * p
    mass = torch.full((text.vocab_size,), 1 / text.vocab_size, dtype=torch.float64)
    first, second = torch.zeros_like(mass), torch.zeros_like(mass)
    for _ in range(seq_len):
        second = second @ p + 2 * (first @ cost_p) + mass @ cost2_p
        first = first @ p + mass @ cost_p
        mass = mass @ p
    mean = float(first.sum())
    return mean, float(second.sum()) - mean**2


def loss_noise(text: MarkovText, batch_size: int, seq_len: int) -> float:
    """The mean |difference| between two independent batches' losses (batch_size x seq_len
    tokens each, the loss a per-token mean) for a model that knows the chain, in nats.

    The batch's sequences are independent, so its loss has variance var(sequence) /
    (batch_size * seq_len**2); the difference of two batches has twice that, and for the
    near-normal sum of hundreds of tokens E|difference| = sqrt(2 var) * sqrt(2 / pi).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    _, variance = sequence_loss_moments(text, seq_len)
    batch_std = math.sqrt(variance / batch_size) / seq_len
    return math.sqrt(2) * batch_std * math.sqrt(2 / math.pi)
