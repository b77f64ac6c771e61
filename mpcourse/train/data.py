"""Synthetic text with structure to learn, made in process: no downloads, same tokens everywhere.

The tokens come from a fixed random Markov chain: after each token only `branching` tokens can
follow, with unequal probabilities. A model that guesses uniformly scores ln(vocab_size) nats;
one that learns the chain approaches the chain's entropy rate, a number we can compute exactly.
So "the loss fell" has a floor to compare with, and every precision chases the same target.
"""
from __future__ import annotations

import math

import torch


class MarkovText:
    """A random Markov chain over `vocab_size` tokens, fixed by `seed`."""

    def __init__(self, vocab_size: int = 256, branching: int = 4, seed: int = 0):
        if not 1 <= branching <= vocab_size:
            raise ValueError(f"branching must be in [1, vocab_size={vocab_size}], got {branching}")
        self.vocab_size, self.branching = vocab_size, branching
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.rand(vocab_size, vocab_size, generator=g).argsort(dim=1)[:, :branching]
        weights = torch.rand(vocab_size, branching, generator=g, dtype=torch.float64) + 0.2
        self.probs = weights / weights.sum(dim=1, keepdim=True)

    @property
    def transition(self) -> torch.Tensor:
        """The (vocab_size, vocab_size) matrix of next-token probabilities, in float64."""
        matrix = torch.zeros(self.vocab_size, self.vocab_size, dtype=torch.float64)
        return matrix.scatter_(1, self.successors, self.probs)

    @property
    def uniform_loss(self) -> float:
        """The loss, in nats, of a model that has learned nothing: ln(vocab_size)."""
        return math.log(self.vocab_size)

    @property
    def entropy_rate(self) -> float:
        """The best loss any model can reach, in nats per token: the chain's entropy rate."""
        p = self.transition
        stationary = torch.full((self.vocab_size,), 1 / self.vocab_size, dtype=torch.float64)
        for _ in range(1000):
            stationary = stationary @ p
        row_entropy = -(p * torch.where(p > 0, p.log(), 0.0)).sum(dim=1)
        return float(stationary @ row_entropy)

    def sample(self, n_sequences: int, length: int, seed: int) -> torch.Tensor:
        """`n_sequences` independent token sequences of `length`, as int64 (n_sequences, length)."""
        g = torch.Generator().manual_seed(seed)
        tokens = torch.empty(n_sequences, length, dtype=torch.int64)
        tokens[:, 0] = torch.randint(self.vocab_size, (n_sequences,), generator=g)
        cumulative = self.probs.cumsum(dim=1)
        uniform = torch.rand(n_sequences, length, generator=g, dtype=torch.float64)
        for t in range(1, length):
            previous = tokens[:, t - 1]
            choice = (uniform[:, t, None] > cumulative[previous]).sum(dim=1).clamp_(max=self.branching - 1)
            tokens[:, t] = self.successors[previous, choice]
        return tokens


class Batches:
    """Training batches that depend only on (seed, step), so a resumed run sees the same data.

    A pool of sequences is sampled once; batch `step` draws its rows from the pool with a
    generator seeded by the step number. Inputs are tokens [0, seq_len), targets are the same
    sequences shifted by one.
    """

    def __init__(self, text: MarkovText, batch_size: int, seq_len: int, *, seed: int = 0,
                 pool_size: int = 2048, device: str | torch.device = "cpu"):
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be positive, got {batch_size}, {seq_len}")
        self.batch_size, self.seed = batch_size, seed
        self.pool = text.sample(pool_size, seq_len + 1, seed=seed).to(device)

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets for training step `step`, each (batch_size, seq_len)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        rows = torch.randint(len(self.pool), (self.batch_size,), generator=g).to(self.pool.device)
        chunk = self.pool[rows]
        return chunk[:, :-1], chunk[:, 1:]
