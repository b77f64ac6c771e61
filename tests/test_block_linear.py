"""BlockScaledLinear's three matmuls, and block-scaled training through the one loop."""
import math

import pytest
import torch
from torch import nn

from mpcourse.block_linear import (BlockScaledLinear, BlockScaledRunConfig,
                                   convert_to_block_scaled, linear_operands)
from mpcourse.blockscale import MXFP8_E4M3, NVFP4, fake_quantize
from mpcourse.models import GPT, GPTConfig
from mpcourse.train import RunConfig, train


@pytest.mark.parametrize("recipe", (MXFP8_E4M3, NVFP4), ids=lambda r: r.name)
def test_each_matmul_sees_operands_blocked_along_its_reduction(recipe):
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    layer = BlockScaledLinear.from_linear(linear, forward_recipe=recipe)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    x = torch.randn(2, 16, 64, requires_grad=True)
    y = layer(x)
    flat = x.detach().reshape(32, 64)
    w = linear.weight.detach()
    expected = fake_quantize(flat, recipe) @ fake_quantize(w, recipe).t() + linear.bias.detach()
    assert torch.equal(y.detach().reshape(32, 32), expected)
    g = torch.randn(2, 16, 32)
    y.backward(g)
    g2 = g.reshape(32, 32)
    grad_x = fake_quantize(g2, recipe) @ fake_quantize(w.t(), recipe).t()
    grad_w = fake_quantize(g2.t(), recipe) @ fake_quantize(flat.t(), recipe).t()
    assert torch.equal(x.grad.reshape(32, 64), grad_x)
    assert torch.equal(linear.weight.grad, grad_w)
    assert torch.equal(linear.bias.grad, g2.sum(0))
    # Quantized, so not FP32's gradient, but close to it.
    exact = g2.t() @ flat
    assert not torch.equal(grad_w, exact)
    assert (grad_w - exact).norm() < 0.3 * exact.norm()


def test_conversion_keeps_the_head_and_everything_that_is_not_a_linear():
    model = GPT(GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=1, n_heads=2))
    replaced = convert_to_block_scaled(model, forward_recipe=MXFP8_E4M3)
    assert replaced == ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.0", "blocks.0.mlp.2"]
    assert type(model.head) is nn.Linear
    assert isinstance(model.blocks[0].mlp[0], BlockScaledLinear)


def test_block_scaled_training_runs_through_the_one_loop_and_tracks_fp32():
    sizes = dict(steps=6, d_model=32, n_layers=1, n_heads=2, batch_size=4, seq_len=16,
                 eval_batches=1, device="cpu", warmup_steps=0)
    fp32 = train(RunConfig(precision="fp32", loss_scaling="off", **sizes))
    mx = train(BlockScaledRunConfig(recipe="mxfp8", **sizes))
    assert mx.config.label == "mxfp8 linears" and len(mx.losses) == 6
    assert all(math.isfinite(loss) for loss in mx.losses)
    assert mx.losses[0] == pytest.approx(fp32.losses[0], abs=0.01)   # same model, same data
    assert mx.losses != fp32.losses
    assert abs(mx.eval_loss - fp32.eval_loss) < 0.1


@pytest.mark.parametrize("kwargs, message", [
    (dict(recipe="mxfp9"), "unknown recipe 'mxfp9'; choose one of mxfp8, nvfp4"),
    (dict(precision="bf16"), "keeps its other math in fp32"),
    (dict(loss_scaling="dynamic"), "takes no loss scaling"),
])
def test_block_scaled_run_config_rejects_bad_switches(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockScaledRunConfig(**kwargs)


def test_linear_operands_are_what_the_layer_multiplied_in_training():
    sizes = dict(steps=3, d_model=32, n_layers=1, n_heads=2, batch_size=4, seq_len=16,
                 eval_batches=1, device="cpu", warmup_steps=0, precision="fp32", loss_scaling="off")
    got = linear_operands(RunConfig(**sizes), "blocks.0.mlp.2")
    assert got["activation"].shape == (64, 128) and got["gradient"].shape == (64, 32)
    assert got["weight"].shape == (32, 128)
    assert got["activation"].min() >= -0.17   # the output of a GELU, which never goes below -0.17
    assert got["gradient"].abs().max() > 0 and got["gradient"].isfinite().all()
    with pytest.raises(ValueError, match="'blocks.0.norm1' is a LayerNorm, not a linear layer"):
        linear_operands(RunConfig(**sizes), "blocks.0.norm1")
