"""Lesson 06's yardstick, the sampling noise of a batch's loss, computed exactly from the chain.

The exact forward pass over the transition table is checked against sequences drawn by
`MarkovText.sample` (an independent path: it samples tokens, never touches the moments), at the
CPU size and at the GPU size of the lesson. At the GPU size the old fixed yardstick, `0.05 <
batch_noise / 2`, cannot hold once the model has learned the chain: the noise is then 0.0045.
"""
import functools
import math

import pytest
import torch

from mpcourse.train import LESSON_CPU_CONFIG, LESSON_CUDA_CONFIG
from mpcourse.train.batch_noise import loss_noise, sequence_loss_moments
from mpcourse.train.data import MarkovText

TEXT = MarkovText(LESSON_CPU_CONFIG.vocab_size, seed=LESSON_CPU_CONFIG.seed)
SIZES = {"cpu": (LESSON_CPU_CONFIG.batch_size, LESSON_CPU_CONFIG.seq_len),
         "gpu": (LESSON_CUDA_CONFIG.batch_size, LESSON_CUDA_CONFIG.seq_len)}


PAIRS = 150  # pairs of batches sampled per size: enough for a 4-standard-error check


@functools.cache
def sampled_sequence_losses(size: str) -> torch.Tensor:
    """The summed loss of 2 * PAIRS batches of sampled sequences under the chain's own
    probabilities (the loss of a model that knows the chain), one row per sequence."""
    batch, seq_len = SIZES[size]
    tokens = TEXT.sample(2 * PAIRS * batch, seq_len + 1, seed=1)
    return -TEXT.transition[tokens[:, :-1], tokens[:, 1:]].log().sum(dim=1)


@pytest.mark.parametrize("size", SIZES)
def test_exact_moments_match_sampled_sequences(size):
    _, seq_len = SIZES[size]
    sampled = sampled_sequence_losses(size)
    n = len(sampled)
    mean, variance = sequence_loss_moments(TEXT, seq_len)
    # Standard errors: sqrt(var / n) for the mean, about var * sqrt(2 / n) for the variance.
    assert abs(sampled.mean().item() - mean) < 5 * math.sqrt(variance / n)
    assert abs(sampled.var().item() / variance - 1) < 5 * math.sqrt(2 / n)
    assert mean / seq_len == pytest.approx(TEXT.entropy_rate, rel=0.01), "the mean is the entropy rate"


@pytest.mark.parametrize("size", SIZES)
def test_loss_noise_is_the_mean_difference_of_sampled_batches(size):
    batch, seq_len = SIZES[size]
    losses = sampled_sequence_losses(size) / seq_len
    batch_losses = losses.view(2, PAIRS, batch).mean(dim=2)
    differences = (batch_losses[0] - batch_losses[1]).abs()
    noise = loss_noise(TEXT, batch, seq_len)
    standard_error = differences.std().item() / math.sqrt(PAIRS)
    assert abs(differences.mean().item() - noise) < 4 * standard_error


def test_noise_shrinks_with_the_square_root_of_the_tokens_per_batch():
    cpu, gpu = (loss_noise(TEXT, *SIZES[s]) for s in ("cpu", "gpu"))
    assert round(cpu, 3) == 0.026 and round(gpu, 4) == 0.0045
    # Consecutive tokens of one sequence are correlated, so the ratio is sqrt(32) only nearly.
    assert cpu / gpu == pytest.approx(math.sqrt(1024 / 32), rel=0.01)
    assert loss_noise(TEXT, 4 * SIZES["cpu"][0], SIZES["cpu"][1]) == pytest.approx(cpu / 2, rel=1e-12)


def test_the_old_yardstick_fails_at_the_gpu_size_and_the_derived_one_scales():
    """Lesson 06 asserted `0.05 < batch_noise / 2` with 0.05 tuned at the CPU size. A GPU run
    whose model has learned the chain measures batch_noise near loss_noise (0.0045), so the old
    assertion fails there; the lesson's tolerance, twice the noise, is 0.05 at the CPU size and
    follows the tokens per batch."""
    gpu = loss_noise(TEXT, *SIZES["gpu"])
    assert not 0.05 < gpu / 2
    tolerance = {s: 2 * loss_noise(TEXT, *SIZES[s]) for s in SIZES}
    assert round(tolerance["cpu"], 2) == 0.05 and tolerance["gpu"] < 0.01


def test_bad_sizes_are_refused_by_name():
    with pytest.raises(ValueError, match="seq_len must be at least 1, got 0"):
        sequence_loss_moments(TEXT, 0)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        loss_noise(TEXT, 0, 32)
