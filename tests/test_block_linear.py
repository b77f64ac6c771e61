"""BlockScaledLinear's three matmuls, and block-scaled training through the one loop."""
import math

import pytest
import torch
from torch import nn

from mpcourse.lowbit.linears import (RECIPES_BY_NAME, BlockScaledLinear, LinearRecipe, add_outlier_feature,
                                      convert_to_block_scaled, hadamard_along_columns, random_hadamard,
                                      weight_for_both_passes)
from mpcourse.train.variants.block_scaled import BlockScaledRunConfig, OutlierRunConfig, linear_operands
from mpcourse.lowbit.blockscale import MXFP8_E4M3, NVFP4, NVFP4_16x16, fake_quantize
from mpcourse.train.models import GPT, GPTConfig
from mpcourse.optim.stochastic import stochastic_round
from mpcourse.train import RunConfig, train


@pytest.mark.parametrize("recipe", (MXFP8_E4M3, NVFP4), ids=lambda r: r.name)
def test_each_matmul_sees_operands_blocked_along_its_reduction(recipe):
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    layer = BlockScaledLinear.from_linear(linear, recipe=LinearRecipe(recipe, recipe, recipe))
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


def test_a_16x16_weight_is_quantized_once_and_serves_forward_and_backward():
    torch.manual_seed(1)
    w = torch.randn(48, 64) * torch.logspace(-1, 1, 64)
    forward, backward = weight_for_both_passes(w, NVFP4_16x16)
    assert forward is backward                             # one quantized copy
    assert torch.equal(forward, fake_quantize(w.t().contiguous(), NVFP4_16x16).t())
    forward_1d, backward_1d = weight_for_both_passes(w, NVFP4)
    assert not torch.equal(forward_1d, backward_1d)        # 1x16: two copies that disagree
    # In the layer: grad_x multiplies by exactly the W the forward pass used.
    layer = BlockScaledLinear(64, 48, bias=False, recipe=RECIPES_BY_NAME["nvfp4_2d"])
    layer.weight.data.copy_(w)
    x = torch.randn(16, 64, requires_grad=True)
    g = torch.randn(16, 48)
    layer(x).backward(g)
    assert torch.equal(x.grad, fake_quantize(g, NVFP4) @ forward)


def test_the_random_hadamard_transform_is_orthogonal_and_cancels_in_the_weight_gradient():
    h = random_hadamard(16, torch.Generator().manual_seed(0))
    assert torch.allclose(h @ h.t(), torch.eye(16), atol=1e-6)
    assert set(h.abs().flatten().tolist()) == {0.25}
    with pytest.raises(ValueError, match="power-of-two size, got 12"):
        random_hadamard(12)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(8, 64, generator=g), torch.randn(5, 64, generator=g)
    ha, hb = hadamard_along_columns(a, h), hadamard_along_columns(b, h)
    assert torch.allclose(ha @ hb.t(), a @ b.t(), atol=1e-4)
    # An outlier is spread over its 16 values: the block's amax falls 4x (1/sqrt(16)).
    spike = torch.zeros(1, 16)
    spike[0, 3] = 8.0
    assert torch.allclose(hadamard_along_columns(spike, h).abs(), torch.full((1, 16), 2.0))


def test_stochastic_gradients_round_up_or_down_without_bias():
    """The NVFP4 recipe's grad_x is g, stochastically rounded on its NVFP4 grid, times W."""
    layer = BlockScaledLinear(16, 16, bias=False, recipe=RECIPES_BY_NAME["nvfp4_2d_sr"],
                              generator=torch.Generator().manual_seed(5))
    nn.init.eye_(layer.weight)
    x = torch.randn(16, 16, requires_grad=True)
    g = torch.full((16, 16), 0.7)
    g[:, 0] = 6.0                                          # block amax 6: scale 1, so 0.7 lies between 0.5 and 1
    layer(x).backward(g)
    values = x.grad[:, 1:]
    assert set(values.flatten().tolist()) == {0.5, 1.0}    # rounded each way, not always to nearest
    assert values.mean().item() == pytest.approx(0.7, abs=0.05)   # unbiased
    assert stochastic_round(torch.tensor([0.7]), NVFP4.element).item() in (0.5, 1.0)


def test_conversion_keeps_the_head_and_everything_that_is_not_a_linear():
    model = GPT(GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=1, n_heads=2))
    replaced = convert_to_block_scaled(model, RECIPES_BY_NAME["mxfp8"])
    assert replaced == ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.0", "blocks.0.mlp.2"]
    assert type(model.head) is nn.Linear
    assert isinstance(model.blocks[0].mlp[0], BlockScaledLinear)


def test_the_mxfp8_recipe_uses_the_round_up_rule_and_the_nvfp4_recipe_is_complete():
    assert {r.rule for r in (RECIPES_BY_NAME["mxfp8"].inputs, RECIPES_BY_NAME["mxfp8"].weights,
                             RECIPES_BY_NAME["mxfp8"].gradients)} == {"mx_rceil"}
    assert RECIPES_BY_NAME["mxfp4_floor"].inputs.rule == "mx_floor"
    nvfp4 = RECIPES_BY_NAME["nvfp4"]
    assert nvfp4.weights.block == (16, 16) and nvfp4.inputs.block == (1, 16)
    assert nvfp4.stochastic_gradients and nvfp4.hadamard_wgrad
    assert RECIPES_BY_NAME["deepseek"].weights.block == (128, 128)


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
    nvfp4 = train(BlockScaledRunConfig(recipe="nvfp4", **sizes))
    assert nvfp4.losses == train(BlockScaledRunConfig(recipe="nvfp4", **sizes)).losses   # replayable
    # keep_blocks=(-1,) keeps the only block's linears in FP32: the run is FP32's.
    kept = train(BlockScaledRunConfig(recipe="per_tensor_fp4", keep_blocks=(-1,), **sizes))
    assert kept.losses == fp32.losses and kept.config.label == "per_tensor_fp4 linears, blocks [-1] kept"


@pytest.mark.parametrize("kwargs, message", [
    (dict(recipe="mxfp9"), "unknown recipe 'mxfp9'; choose one of mxfp8, mxfp8_floor"),
    (dict(outlier_gain=0), "outlier_gain must be a positive finite number, got 0"),
    (dict(outlier_gain=math.inf), "outlier_gain must be a positive finite number, got inf"),
    (dict(precision="bf16"), "keeps its other math in fp32"),
    (dict(loss_scaling="dynamic"), "takes no loss scaling"),
    (dict(keep_blocks=(2,)), r"keep_blocks \(2,\) names a block outside the model's 2"),
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


def _mlp2_inputs(model, x):
    seen = {}
    hooks = [block.mlp[2].register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, i[0].detach()))
             for k, block in enumerate(model.blocks)]
    model(x)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("config_class, extra", [(OutlierRunConfig, {}),
                                                 (BlockScaledRunConfig, dict(recipe="nvfp4"))])
def test_an_outlier_feature_is_a_gain_on_one_input_and_leaves_the_weights(config_class, extra):
    """No staging: the second MLP linear's input feature 0 is 100x larger, nothing else is, and
    the weights are the model's own, untouched (the old staging divided weight column 0 by 100,
    which made every FP4 weight quantizer flush that column to zero)."""
    config = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=2, n_heads=2)
    torch.manual_seed(3)
    plain = config_class(outlier_gain=1.0, d_model=32, n_layers=2, n_heads=2, **extra).prepare_model(GPT(config))
    torch.manual_seed(3)
    run = config_class(outlier_gain=100.0, d_model=32, n_layers=2, n_heads=2, **extra)
    amplified = run.prepare_model(GPT(config))
    for (name, p), q in zip(plain.named_parameters(), amplified.parameters()):
        assert torch.equal(p, q), name
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(4)
    before = _mlp2_inputs(plain, tokens)[0]
    torch.manual_seed(4)
    after = _mlp2_inputs(amplified, tokens)[0]     # block 0: its input is the same in both models
    assert torch.equal(after[..., 0], before[..., 0] * 100) and torch.equal(after[..., 1:], before[..., 1:])
    assert "outlier x100" in run.label


def test_the_outlier_gain_reaches_the_gradients_and_per_tensor_fp4_loses_the_ordinary_features():
    torch.manual_seed(2)
    x = torch.randn(64, 128).abs()          # a GELU's output is mostly positive
    x[:, 0] *= 100                          # what the gain hands the layer
    linear = nn.Linear(128, 32)
    reference = linear(x).detach()
    errors = {}
    for name in ("per_tensor_fp4", "nvfp4_1d", "mxfp8"):
        layer = BlockScaledLinear.from_linear(linear, recipe=RECIPES_BY_NAME[name])
        errors[name] = ((layer(x).detach() - reference).norm() / reference.norm()).item()
    assert errors["mxfp8"] < errors["nvfp4_1d"] / 2 and errors["nvfp4_1d"] < errors["per_tensor_fp4"] / 1.5
    # per tensor, every ordinary value is below a twelfth of the amax: FP4 keeps almost none
    kept = fake_quantize(x, RECIPES_BY_NAME["per_tensor_fp4"].inputs)[:, 1:].ne(0).float().mean()
    assert kept < 0.05
    model = GPT(GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=1, n_heads=2))
    add_outlier_feature(model, 100.0)
    model(torch.randint(0, 64, (2, 16))).sum().backward()
    assert model.blocks[0].mlp[2].weight.grad[:, 0].abs().sum() > 0
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_the_outlier_layer_multiplies_its_own_weight_with_no_column_divided():
    """The forward of an NVFP4 run's second MLP linear, on an input with the outlier gain, is
    exactly quantize(x) @ quantize(W).T + b with the model's W: no weight column is divided (the
    old staging divided column 0 by the gain, and FP4 then flushed that column to zero)."""
    config = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=1, n_heads=2)
    torch.manual_seed(5)
    model = BlockScaledRunConfig(recipe="nvfp4", outlier_gain=100.0, d_model=32, n_layers=1,
                                 n_heads=2).prepare_model(GPT(config))
    layer = model.blocks[0].mlp[2]
    # what the layer's forward receives: its input after the gain's pre-hook
    gained = _mlp2_inputs(model, torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1)))[0]
    flat = gained.reshape(-1, layer.in_features)
    assert flat[:, 0].abs().mean() > 20 * flat[:, 1:].abs().mean()
    w_forward, _ = weight_for_both_passes(layer.weight.detach(), NVFP4_16x16)
    expected = fake_quantize(flat, NVFP4) @ w_forward.t() + layer.bias.detach()
    with torch.no_grad():
        got = layer.forward(gained).reshape(-1, layer.out_features)
    assert torch.equal(got, expected)
    assert w_forward[:, 0].ne(0).any()      # the column that reads the outlier is kept
