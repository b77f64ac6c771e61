"""Kahan-compensated 16-bit weights against float64 sums and FP32 master weights."""
import pytest
import torch

from mpcourse.optim.kahan import KahanOptimizer, classic_kahan_add, compensated_add, split
from mpcourse.amp.master import MasterWeightOptimizer


def test_split_is_exact_when_the_lost_part_fits_the_compensation():
    exact = torch.tensor([1.0 + 2**-10, 3.0 + 2**-12, -0.5 - 2**-14])
    weight, compensation = split(exact, torch.bfloat16, torch.bfloat16)
    assert weight.dtype == compensation.dtype == torch.bfloat16
    assert torch.equal(weight, exact.bfloat16()), "the weight is the nearest bf16 value"
    assert torch.equal(weight.float() + compensation.float(), exact)


def test_ten_thousand_small_additions_match_float64_where_plain_bf16_loses_them_all():
    update = torch.tensor([1e-4, -3e-5, 2.5e-4])
    weight = torch.ones(3, dtype=torch.bfloat16)
    plain = weight.clone()
    compensation = torch.zeros_like(weight)
    for _ in range(10_000):
        weight, compensation = compensated_add(weight, compensation, update)
        plain = plain + update.bfloat16()
    exact = 1.0 + 10_000 * update.double()
    assert torch.equal(plain, torch.ones(3, dtype=torch.bfloat16)), "each addition rounds away"
    carried = weight.double() + compensation.double()
    # The compensation is below half the weight's gap (2**-8 in [1, 2), 2**-7 in [2, 4)) and is
    # itself rounded to bf16 each step, losing up to 2**-9 of it: at most 2**-17 or 2**-16 a step.
    gap = 2.0 ** (torch.floor(torch.log2(torch.maximum(carried, exact))) - 7)
    assert ((carried - exact).abs() <= 10_000 * gap * 2**-10).all()
    assert ((carried - exact).abs() <= 0.03 * (exact - 1).abs()).all(), "97% of the sum is kept"
    assert torch.equal(weight, carried.float().bfloat16()), "the weight is the sum rounded"


def test_kahan_optimizer_tracks_fp32_masters():
    g = torch.Generator().manual_seed(0)
    start = (torch.randn(512, generator=g)).bfloat16()
    grads = [(torch.randn(512, generator=g) * 1e-2).bfloat16() for _ in range(200)]
    weights = {}
    for name, wrapper in (("kahan", KahanOptimizer), ("master", MasterWeightOptimizer)):
        weight = torch.nn.Parameter(start.clone())
        optimizer = wrapper([weight], torch.optim.AdamW, lr=1e-3, weight_decay=0.0)
        for grad in grads:
            optimizer.zero_grad()
            (weight * grad).sum().backward()  # the gradient is `grad`, reaching masters by hook
            optimizer.step()
        weights[name] = (weight, optimizer)
    kahan_weight, kahan = weights["kahan"]
    master = weights["master"][1].master_parameters()[0].detach()
    carried = kahan_weight.float() + kahan.state[kahan_weight]["compensation"].float()
    kahan_weight = kahan_weight.detach()
    # Each step rounds the compensation (below half the weight's gap) to bf16: at most
    # 2**-9 * 2**-8 of the weight's power of two per step, over 200 steps.
    power = 2.0 ** torch.floor(torch.log2(master.abs()))
    error = (carried.detach() - master).abs()
    assert (error <= 200 * power * 2**-17).all()
    assert (kahan_weight == master.bfloat16()).float().mean() > 0.99
    assert not torch.equal(kahan_weight, start), "the small AdamW steps were kept"


def test_state_dict_round_trip_restores_the_compensation():
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    optimizer = KahanOptimizer([weight], torch.optim.SGD, lr=1e-3)
    weight.grad = torch.full((4,), 0.1, dtype=torch.bfloat16)
    optimizer.step()
    saved = optimizer.state_dict()
    compensation = optimizer.state[weight]["compensation"].clone()
    assert compensation.abs().sum() > 0
    optimizer.state[weight]["compensation"].zero_()
    optimizer.load_state_dict(saved)
    assert torch.equal(optimizer.state[weight]["compensation"], compensation)


def test_rejects_fp32_weights():
    with pytest.raises(ValueError, match="16-bit weights"):
        KahanOptimizer([torch.nn.Parameter(torch.ones(2))], torch.optim.SGD, lr=1)


def test_classic_form_is_four_roundings_as_ml_dtypes_computes_them():
    """optimi's order with numpy's FP32 and ml_dtypes' BF16 arithmetic: the FP32 update added to
    the compensation in FP32 and rounded once, then three BF16 operations, each rounded."""
    import ml_dtypes
    import numpy as np
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(4096, generator=g).bfloat16()
    compensation = (torch.randn(4096, generator=g) * 1e-3).bfloat16()
    update = torch.randn(4096, generator=g) * 1e-4          # FP32, as an optimizer computes it
    got_weight, got_compensation = classic_kahan_add(weight, compensation, update)
    bf16 = ml_dtypes.bfloat16
    w, c = (t.float().numpy().astype(bf16) for t in (weight, compensation))
    c = (c.astype(np.float32) + update.numpy()).astype(bf16)   # rounding 1
    new = (w + c).astype(bf16)                                  # rounding 2
    c = (c + (w - new).astype(bf16)).astype(bf16)               # roundings 3 and 4
    assert np.array_equal(got_weight.float().numpy(), new.astype(np.float32))
    assert np.array_equal(got_compensation.float().numpy(), c.astype(np.float32))
    # The test tells the forms apart: rounding the update to BF16 on its own first, a fifth
    # rounding, changes some compensations.
    five = compensation + update.bfloat16()
    five = five + (weight - (weight + five))
    assert not torch.equal(five, got_compensation)


def test_classic_form_is_optimi_kahan_sum_bit_for_bit():
    """optimi's own for-loop path (`kahan_sum=True`, BF16 weights, moments and compensation).
    Its Adam adds -lr * m / (sqrt(v) + eps) into the compensation with one `addcdiv_`; with lr a
    power of two that FP32 update is the same however the product is ordered, so it is formed
    here from optimi's own moments, and `classic_kahan_add` must then give optimi's weight and
    compensation exactly, step after step."""
    from optimi import Adam
    lr, eps = 2**-9, 1e-6
    g = torch.Generator().manual_seed(5)
    start = torch.randn(4096, generator=g).bfloat16()
    weight = torch.nn.Parameter(start.clone())
    optimizer = Adam([weight], lr=lr, eps=eps, kahan_sum=True, foreach=False, triton=False)
    ours, compensation = start.clone(), torch.zeros_like(start)
    for _ in range(30):
        weight.grad = (torch.randn(4096, generator=g) * 0.05).bfloat16()
        optimizer.step()
        state = optimizer.state[weight]
        denominator = state["exp_avg_sq"].sqrt().add_(eps)      # BF16, as optimi forms it
        update = -lr * (state["exp_avg"].float() / denominator.float())
        ours, compensation = classic_kahan_add(ours, compensation, update)
        assert torch.equal(weight.detach(), ours)
        assert torch.equal(state["kahan_comp"], compensation)
    assert not torch.equal(ours, start) and compensation.abs().sum() > 0


def test_classic_form_keeps_small_updates_like_the_fp32_form():
    w1 = w2 = torch.ones(1, dtype=torch.bfloat16)
    c1 = c2 = torch.zeros(1, dtype=torch.bfloat16)
    update = torch.full((1,), 5e-5)
    for _ in range(10_000):
        w1, c1 = compensated_add(w1, c1, update)
        w2, c2 = classic_kahan_add(w2, c2, update)
    for w, c in ((w1, c1), (w2, c2)):
        assert abs((w.double() + c.double()).item() - 1.5) < 0.05 * 0.5  # within 5% of the way
    assert (w1.double() + c1.double()).item() == pytest.approx((w2.double() + c2.double()).item(),
                                                               abs=2**-7)


def test_the_shortfall_grows_with_the_distance_so_it_is_systematic():
    """Random errors would grow as the square root of the steps; this one doubles with them."""
    from mpcourse.amp.update_walk import walk
    short = [1.0 + n * 5e-5 - walk(1.0, 5e-5, n, "kahan", record_every=n)[-1].item()
             for n in (5_000, 10_000, 20_000)]
    assert short[0] > 0 and short[1] == pytest.approx(2 * short[0]) and short[2] == pytest.approx(4 * short[0])
