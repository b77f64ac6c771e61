"""The synthetic Markov text: reproducible, faithful to its chain, and with a computable floor."""
import math

import pytest
import torch

from mpcourse.train.data import Batches, MarkovText


def test_same_seed_same_tokens_other_seed_other_tokens():
    a, b = MarkovText(seed=1), MarkovText(seed=1)
    assert torch.equal(a.sample(8, 20, seed=3), b.sample(8, 20, seed=3))
    assert not torch.equal(a.sample(8, 20, seed=3), a.sample(8, 20, seed=4))
    assert not torch.equal(a.transition, MarkovText(seed=2).transition)


def test_transition_rows_are_distributions_with_branching_successors():
    text = MarkovText(vocab_size=40, branching=3)
    p = text.transition
    torch.testing.assert_close(p.sum(dim=1), torch.ones(40, dtype=torch.float64))
    assert ((p > 0).sum(dim=1) == 3).all()


def test_samples_follow_the_transition_probabilities():
    text = MarkovText(vocab_size=8, branching=3, seed=5)
    tokens = text.sample(400, 200, seed=0)
    pairs = tokens[:, :-1] * 8 + tokens[:, 1:]
    counts = torch.bincount(pairs.flatten(), minlength=64).view(8, 8).double()
    assert (counts[text.transition == 0] == 0).all(), "a transition the chain forbids was sampled"
    empirical = counts / counts.sum(dim=1, keepdim=True)
    torch.testing.assert_close(empirical, text.transition, atol=0.02, rtol=0)


def test_entropy_rate_is_the_stationary_average_of_row_entropies():
    text = MarkovText(vocab_size=30, branching=4, seed=2)
    p = text.transition
    eigenvalues, eigenvectors = torch.linalg.eig(p.T)
    stationary = eigenvectors[:, eigenvalues.real.argmax()].real
    stationary = stationary / stationary.sum()
    rows = torch.tensor([-sum(x * math.log(x) for x in row if x > 0) for row in p.tolist()],
                        dtype=torch.float64)
    assert text.entropy_rate == pytest.approx(float(stationary @ rows), rel=1e-9)
    assert 0 < text.entropy_rate < math.log(4) < text.uniform_loss == pytest.approx(math.log(30))


def test_batches_depend_only_on_seed_and_step():
    text = MarkovText()
    a, b = Batches(text, 4, 16, seed=7), Batches(text, 4, 16, seed=7)
    x1, y1 = a.get(5)
    for _ in range(3):
        a.get(0)
    x2, y2 = b.get(5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == y1.shape == (4, 16)
    assert torch.equal(x1[:, 1:], y1[:, :-1]), "targets are the inputs shifted by one token"
    assert not torch.equal(a.get(6)[0], x1)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="branching"):
        MarkovText(vocab_size=4, branching=5)
    with pytest.raises(ValueError, match="batch_size"):
        Batches(MarkovText(), 0, 8)
