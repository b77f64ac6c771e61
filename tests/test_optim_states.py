"""AdamW with FP32, BF16 and 8-bit block-scaled moments, against torchao's optimizers.

torchao runs its update through torch.compile; the tests run the same function eagerly, which
computes the same thing and needs no compiler.
"""
import math

import pytest
import torch
import torchao.optim as torchao_optim  # the reference implementation (a dev dependency)

from mpcourse.formats import FP8_E4M3, round_to
from mpcourse.optim_states import AdamW, dequantize_blockwise, quantize_blockwise


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)


def _run(make, init, grads):
    p = torch.nn.Parameter(init.clone())
    optimizer = make([p])
    for grad in grads:
        p.grad = grad.to(p.dtype)
        optimizer.step()
    return p.detach(), optimizer


def _problem(dtype=torch.float32, n=64 * 64, steps=5):
    g = torch.Generator().manual_seed(0)
    init = torch.randn(n, generator=g).reshape(64, -1).to(dtype)
    grads = [torch.randn(init.shape, generator=g) * (1 + i) for i in range(steps)]
    return init, grads


KW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def test_8bit_moments_equal_torchao_adamw_fp8_bit_for_bit(eager):
    init, grads = _problem()
    ours, ours_opt = _run(lambda ps: AdamW(ps, state_format="8bit", **KW), init, grads)
    theirs, theirs_opt = _run(lambda ps: torchao_optim.AdamWFp8(ps, **KW), init, grads)
    assert torch.equal(ours, theirs)
    state, reference = next(iter(ours_opt.state.values())), next(iter(theirs_opt.state.values()))
    for name in ("exp_avg", "exp_avg_sq"):
        assert state[name].dtype == torch.float8_e4m3fn
        assert torch.equal(state[name].view(torch.uint8), reference[name].codes.view(torch.uint8))
        assert torch.equal(state[name + "_scale"], reference[name].scale)


def test_bf16_moments_on_bf16_weights_equal_torchao_adamw_bit_for_bit(eager):
    init, grads = _problem(torch.bfloat16)
    ours, ours_opt = _run(lambda ps: AdamW(ps, state_format="bf16", **KW), init, grads)
    theirs, _ = _run(lambda ps: torchao_optim._AdamW(ps, **KW), init, grads)
    assert torch.equal(ours, theirs)
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in ours_opt.state.values())


def test_fp32_moments_match_torch_adamw():
    init, grads = _problem()
    ours, _ = _run(lambda ps: AdamW(ps, **KW), init, grads)
    theirs, _ = _run(lambda ps: torch.optim.AdamW(ps, foreach=False, **KW), init, grads)
    # The same formula with the operations in a different order: a few FP32 roundings apart.
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("state_format, tolerance", [("bf16", 2e-3), ("8bit", 2e-2)])
def test_smaller_moments_stay_close_to_fp32_moments(state_format, tolerance):
    """Over 20 steps of lr 1e-2 the weights move by up to 0.2 (at least 0.1); BF16 moments (2**-9 relative
    error per store) keep them within 2e-3 of FP32 moments, E4M3 codes (2**-4) within 2e-2."""
    init, grads = _problem(steps=20)
    grads = [g / (1 + i) for i, g in enumerate(grads)]
    reference, _ = _run(lambda ps: AdamW(ps, **KW), init, grads)
    ours, _ = _run(lambda ps: AdamW(ps, state_format=state_format, **KW), init, grads)
    assert (ours - reference).abs().max() < tolerance
    assert (ours - init).abs().max() > 0.1, "the weights moved"


def test_blockwise_codes_are_e4m3_rounding_of_the_scaled_block():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1000, generator=g) * torch.logspace(-3, 3, 1000)  # 1000 = 3 blocks + 232
    codes, scale = quantize_blockwise(x, 256)
    assert codes.shape == x.shape and codes.dtype == torch.float8_e4m3fn
    assert scale.shape == (4,)
    for b in range(4):
        block = x[b * 256:(b + 1) * 256]
        assert scale[b] == torch.tensor(block.abs().max().item() / 448.0, dtype=torch.float32)
        want = round_to(block / scale[b], FP8_E4M3) * scale[b]
        assert torch.equal(dequantize_blockwise(codes, scale, 256)[b * 256:(b + 1) * 256], want)


def test_an_outlier_zeroes_its_block_neighbours():
    x = torch.full((256,), 1e-3)
    x[0] = 1e3  # 1e6 times larger: below the block's smallest subnormal, 448 / 2**9 / 1e6 * 1e3
    decoded = dequantize_blockwise(*quantize_blockwise(x, 256), 256)
    assert decoded[0] == pytest.approx(1e3, rel=2**-4)
    assert (decoded[1:] == 0).all()
    assert math.isclose(FP8_E4M3.smallest_subnormal, 2**-9)


@pytest.mark.parametrize("state_format", ["bf16", "8bit"])
def test_loading_a_state_dict_keeps_the_storage_dtype(state_format):
    init, grads = _problem(steps=2)
    _, saved = _run(lambda ps: AdamW(ps, state_format=state_format, **KW), init, grads)
    restored = AdamW([torch.nn.Parameter(init.clone())], state_format=state_format, **KW)
    restored.load_state_dict(saved.state_dict())
    for name in ("exp_avg", "exp_avg_sq"):
        got, want = next(iter(restored.state.values()))[name], next(iter(saved.state.values()))[name]
        assert got.dtype == want.dtype != torch.float32
        assert torch.equal(got.float(), want.float())


def test_rejects_unknown_state_formats_and_block_sizes():
    p = [torch.nn.Parameter(torch.ones(2))]
    with pytest.raises(ValueError, match="state_format 'int4'.*fp32, bf16, 8bit"):
        AdamW(p, state_format="int4")
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        AdamW(p, block_size=0)
