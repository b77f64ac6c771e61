"""AdamW with FP32, BF16 and 8-bit block-scaled moments, against torchao's optimizers.

torchao runs its update through torch.compile; the tests run the same function eagerly, which
computes the same thing and needs no compiler.
"""
import math

import pytest
import torch
import torchao.optim as torchao_optim  # the reference implementation (a dev dependency)

from mpcourse.optim.optim_states import AdamW


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
    ours, ours_opt = _run(lambda ps: AdamW(ps, state_format="e4m3", **KW), init, grads)
    theirs, theirs_opt = _run(lambda ps: torchao_optim.AdamWFp8(ps, **KW), init, grads)
    assert torch.equal(ours, theirs)
    state, reference = next(iter(ours_opt.state.values())), next(iter(theirs_opt.state.values()))
    for name in ("exp_avg", "exp_avg_sq"):
        assert state[name].dtype == torch.float8_e4m3fn
        assert torch.equal(state[name].view(torch.uint8), reference[name].codes.view(torch.uint8))
        assert torch.equal(state[name + "_scale"], reference[name].scale)


def test_dynamic_code_moments_equal_torchao_adamw_8bit_bit_for_bit(eager):
    init, grads = _problem()
    ours, ours_opt = _run(lambda ps: AdamW(ps, state_format="dynamic", **KW), init, grads)
    theirs, theirs_opt = _run(lambda ps: torchao_optim.AdamW8bit(ps, **KW), init, grads)
    assert torch.equal(ours, theirs)
    state, reference = next(iter(ours_opt.state.values())), next(iter(theirs_opt.state.values()))
    for name in ("exp_avg", "exp_avg_sq"):
        assert state[name].dtype == torch.uint8
        assert torch.equal(state[name], reference[name].codes)
        assert torch.equal(state[name + "_scale"], reference[name].scale)
    assert not reference["exp_avg_sq"].signed and reference["exp_avg"].signed


@pytest.mark.parametrize("numel", [1024, 4096 + 128, 4096, 8192])
def test_size_threshold_follows_torchao(numel, eager):
    """torchao quantizes a moment only for tensors of >= 4096 values that divide into blocks;
    the others keep it in the parameter's dtype (here BF16), and the weights agree bit for bit."""
    g = torch.Generator().manual_seed(5)
    init = torch.randn(numel, generator=g).bfloat16()
    grads = [torch.randn(numel, generator=g) for _ in range(3)]
    ours, ours_opt = _run(lambda ps: AdamW(ps, state_format="dynamic", **KW), init, grads)
    theirs, theirs_opt = _run(lambda ps: torchao_optim.AdamW8bit(ps, **KW), init, grads)
    assert torch.equal(ours, theirs)
    state, reference = next(iter(ours_opt.state.values())), next(iter(theirs_opt.state.values()))
    quantized = hasattr(reference["exp_avg"], "codes")
    assert quantized == (numel >= 4096 and numel % 256 == 0)
    assert ("exp_avg_scale" in state) == quantized
    assert state["exp_avg"].dtype == (torch.uint8 if quantized else torch.bfloat16)


def test_e5m2_second_moment_is_stored_in_e5m2():
    init, grads = _problem(steps=2)
    _, optimizer = _run(lambda ps: AdamW(ps, state_format="e4m3+e5m2", **KW), init, grads)
    state = next(iter(optimizer.state.values()))
    assert state["exp_avg"].dtype == torch.float8_e4m3fn
    assert state["exp_avg_sq"].dtype == torch.float8_e5m2


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


@pytest.mark.parametrize("state_format, tolerance",
                         [("bf16", 2e-3), ("e4m3", 2e-2), ("dynamic", 2e-2), ("e4m3+e5m2", 2e-2)])
def test_smaller_moments_stay_close_to_fp32_moments(state_format, tolerance):
    """Over 20 steps of lr 1e-2 the weights move by up to 0.2 (at least 0.1); BF16 moments (2**-9 relative
    error per store) keep them within 2e-3 of FP32 moments, E4M3 codes (2**-4) within 2e-2."""
    init, grads = _problem(steps=20)
    grads = [g / (1 + i) for i, g in enumerate(grads)]
    reference, _ = _run(lambda ps: AdamW(ps, **KW), init, grads)
    ours, _ = _run(lambda ps: AdamW(ps, state_format=state_format, **KW), init, grads)
    assert (ours - reference).abs().max() < tolerance
    assert (ours - init).abs().max() > 0.1, "the weights moved"


@pytest.mark.parametrize("state_format", ["bf16", "e4m3", "dynamic", "e4m3+e5m2"])
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
    with pytest.raises(ValueError, match="state_format 'int4'.*fp32, bf16, e4m3, dynamic"):
        AdamW(p, state_format="int4")
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        AdamW(p, block_size=0)
    with pytest.raises(ValueError, match="min_8bit_size must be an integer >= 0, got -1"):
        AdamW(p, min_8bit_size=-1)
