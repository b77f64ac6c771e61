"""The lab's GPT: shapes, tied embeddings, causality, and attention checked against the formula."""
import math

import pytest
import torch
import torch.nn.functional as F

from mpcourse.train.models import GPT, GPTConfig, next_token_loss


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(vocab_size=50, seq_len=12, d_model=16, n_layers=2, n_heads=4), **kw}))


def test_logits_shape_and_tied_embedding():
    model = tiny()
    idx = torch.randint(50, (3, 12))
    assert model(idx).shape == (3, 12, 50)
    assert model.head.weight is model.token_embedding.weight
    assert model.num_parameters() == sum(p.numel() for p in set(model.parameters()))


def test_prediction_at_t_ignores_later_tokens():
    model = tiny()
    idx = torch.randint(50, (2, 12))
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 50
    torch.testing.assert_close(model(idx)[:, :7], model(changed)[:, :7], rtol=0, atol=0)
    assert not torch.equal(model(idx)[:, 7:], model(changed)[:, 7:])


def test_attention_matches_the_softmax_formula():
    model = tiny()
    attn = model.blocks[0].attn
    x = torch.randn(2, 12, 16)
    q, k, v = attn.qkv(x).split(16, dim=-1)
    heads = lambda t: t.view(2, 12, 4, 4).transpose(1, 2)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(4)
    scores = scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(2, 12, 16)
    torch.testing.assert_close(attn(x), attn.proj(y), rtol=1e-5, atol=1e-6)


def test_loss_is_cross_entropy_and_starts_near_uniform():
    model = tiny()
    idx, targets = torch.randint(50, (4, 12)), torch.randint(50, (4, 12))
    logits = model(idx)
    loss = next_token_loss(logits, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1)))
    assert abs(loss.item() - math.log(50)) < 0.1, "small initial weights should give near-uniform predictions"


def test_under_autocast_matmuls_are_bf16_and_loss_is_fp32():
    model = tiny()
    idx = torch.randint(50, (2, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
        loss = next_token_loss(logits, idx)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        GPTConfig(d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="n_layers"):
        GPTConfig(n_layers=0)
    with pytest.raises(ValueError, match="longer than seq_len=12"):
        tiny()(torch.zeros(1, 13, dtype=torch.int64))
