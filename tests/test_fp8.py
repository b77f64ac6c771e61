"""FP8 scaling and Fp8Linear, against torch's float8 casts and torch._scaled_mm."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from mpcourse.train.data import MarkovText
from mpcourse.numbers.formats import BF16, FP8_E4M3, FP8_E5M2
from mpcourse.lowbit.fp8 import (CurrentScaling, DelayedScaling, Fp8EmulationWarning, Fp8Linear, amax,
                                  choose_backend, compute_scale, convert_to_fp8, fake_quantize, quantize)
from mpcourse.train.variants.fp8 import Fp8RunConfig
from mpcourse.train.models import GPT, GPTConfig
from mpcourse.train import RunConfig, train

FORMATS = [FP8_E4M3, FP8_E5M2]


pytestmark = pytest.mark.usefixtures("one_thread")


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor):
    assert got.dtype == expected.dtype == torch.float32
    assert torch.equal(got.isnan(), expected.isnan())
    keep = ~expected.isnan()
    mismatch = (got.view(torch.int32) != expected.view(torch.int32)) & keep
    assert not mismatch.any(), (f"{int(mismatch.sum())} values differ, e.g. got "
                                f"{got[mismatch][:5].tolist()} expected {expected[mismatch][:5].tolist()}")


def wide_range_tensor(seed: int) -> torch.Tensor:
    """Values from far below FP8's subnormals to far above its maximum, both signs, plus specials."""
    g = torch.Generator().manual_seed(seed)
    magnitudes = torch.exp2(torch.empty(20_000).uniform_(-30, 30, generator=g))
    signs = torch.where(torch.rand(20_000, generator=g) < 0.5, -1.0, 1.0)
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 448.0, 464.0, 480.0,
                             57344.0, 61440.0, 2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17])
    return torch.cat([magnitudes * signs, specials])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("scale", [1.0, 2.0**-7, 37.5, 3000.0])
def test_quantize_matches_torch_cast_bitwise_after_scaling(fmt, scale):
    x = wide_range_tensor(seed=int(scale * 8))
    scale = torch.tensor(scale)
    expected = (x * scale).to(fmt.torch_dtype).float()
    assert_same_bits(quantize(x, fmt, scale), expected)
    # and the round trip back to real values is torch's cast divided by the scale
    assert_same_bits(fake_quantize(x, fmt, scale), expected / scale)


def test_overflow_follows_torch_e4m3_saturates_e5m2_goes_to_inf():
    x = torch.tensor([500.0, 1e6, 61440.0, -1e9])
    assert quantize(x, FP8_E4M3, 1.0).tolist() == [448.0, 448.0, 448.0, -448.0]
    assert quantize(x, FP8_E5M2, 1.0).tolist() == [512.0, math.inf, math.inf, -math.inf]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_saturating_quantize_is_torch_cast_of_clipped_values(fmt):
    x = wide_range_tensor(seed=7)
    got = quantize(x, fmt, 1.0, saturate=True)
    assert_same_bits(got, x.clamp(-fmt.max, fmt.max).to(fmt.torch_dtype).float())
    assert got[x.isfinite()].abs().max() == fmt.max   # nothing finite overflows to inf


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_scale_maps_amax_onto_format_max(fmt):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 1e-3
    scale = compute_scale(amax(x), fmt)
    assert scale.dtype == torch.float32
    assert scale.item() == pytest.approx(fmt.max / x.abs().max().item(), rel=1e-6)
    assert quantize(x, fmt, scale).abs().max().item() == fmt.max
    margin_scale = compute_scale(amax(x), fmt, margin=2)
    assert margin_scale.item() == pytest.approx(scale.item() / 4, rel=1e-6)


def test_scale_keeps_previous_when_amax_says_nothing():
    for useless in (0.0, math.inf, math.nan):
        assert compute_scale(useless, FP8_E4M3, previous=8.0).item() == 8.0


def test_per_tensor_scale_rescues_small_values_from_underflow():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 1e-5
    unscaled = quantize(x, FP8_E4M3, 1.0)
    assert (unscaled == 0).all(), "E4M3's smallest subnormal is 2**-9: these all flush to zero"
    rescued = fake_quantize(x, FP8_E4M3)
    normal = x.abs() * compute_scale(amax(x), FP8_E4M3) >= FP8_E4M3.smallest_normal
    relative = ((rescued - x).abs() / x.abs())[normal]
    assert relative.max() <= FP8_E4M3.eps / 2 + 1e-7, "nearest rounding errs by at most half an ulp"


def test_bad_fp8_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="fp8_e4m3 or fp8_e5m2"):
        compute_scale(1.0, BF16)
    with pytest.raises(ValueError, match="margin"):
        DelayedScaling(FP8_E4M3, margin=-1)
    with pytest.raises(ValueError, match="history_len"):
        DelayedScaling(FP8_E4M3, history_len=0)
    with pytest.raises(ValueError, match="recipe"):
        Fp8Linear(4, 4, recipe="just-in-time")
    with pytest.raises(ValueError, match="backend"):
        Fp8Linear(4, 4, backend="tensor-cores")
    with pytest.raises(ValueError, match="precision"):
        Fp8RunConfig(precision="bf16")


def test_delayed_scaling_uses_max_amax_of_previous_steps():
    history_len = 4
    g = torch.Generator().manual_seed(3)
    amaxes = [1.0, 2.0, 0.5, 0.25, 100.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    tensors = [torch.rand(64, generator=g) * a for a in amaxes]
    scaling = DelayedScaling(FP8_E4M3, history_len=history_len)
    seen = []
    for k, x in enumerate(tensors):
        used = scaling.scale_for(x)
        window = [t.abs().max() for t in tensors[max(0, k - history_len):k]]
        expected = 1.0 if not window else FP8_E4M3.max / torch.stack(window).max()
        assert used.item() == pytest.approx(float(expected), rel=1e-6), f"step {k}"
        seen.append(used.item())
    # the outlier at step 4 holds the scale down for exactly history_len steps after it
    assert all(s == pytest.approx(448 / tensors[4].abs().max().item()) for s in seen[5:9])
    assert seen[9] > 100 * seen[8]


def test_current_scaling_uses_the_tensor_itself():
    x = torch.randn(100, generator=torch.Generator().manual_seed(4))
    assert CurrentScaling(FP8_E5M2).scale_for(x).item() == pytest.approx(57344 / x.abs().max().item())


def _layer_and_data(recipe="current", backend="emulated", seed=5):
    torch.manual_seed(seed)
    layer = Fp8Linear(32, 48, recipe=recipe, backend=backend)
    x = torch.randn(4, 8, 32, requires_grad=True)
    grad_y = torch.randn(4, 8, 48) * 1e-4
    return layer, x, grad_y


def test_fp8_linear_is_torch_casts_then_fp32_matmul():
    layer, x, grad_y = _layer_and_data()
    y = layer(x)
    y.backward(grad_y)

    flat_x, w, flat_g = x.detach().reshape(-1, 32), layer.weight.detach(), grad_y.reshape(-1, 48)
    sx, sw, sg = (FP8_E4M3.max / flat_x.abs().max(), FP8_E4M3.max / w.abs().max(),
                  FP8_E5M2.max / flat_g.abs().max())
    qx = (flat_x * sx).to(torch.float8_e4m3fn).float()
    qw = (w * sw).to(torch.float8_e4m3fn).float()
    qg = (flat_g * sg).clamp(-FP8_E5M2.max, FP8_E5M2.max).to(torch.float8_e5m2).float()
    expected_y = (qx @ qw.t()) * (sx.reciprocal() * sw.reciprocal()) + layer.bias.detach()
    assert_same_bits(y.detach().reshape(-1, 48), expected_y)
    assert_same_bits(x.grad.reshape(-1, 32), (qg @ qw) * (sg.reciprocal() * sw.reciprocal()))
    assert_same_bits(layer.weight.grad, (qg.t() @ qx) * (sg.reciprocal() * sx.reciprocal()))
    assert torch.equal(layer.bias.grad, flat_g.sum(0))


def test_fp8_linear_is_close_to_fp32_linear():
    layer, x, grad_y = _layer_and_data(recipe="current")
    y = layer(x)
    y.backward(grad_y)
    x32 = x.detach().clone().requires_grad_()
    w32 = layer.weight.detach().clone().requires_grad_()
    y32 = F.linear(x32, w32, layer.bias.detach())
    y32.backward(grad_y)
    relative = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    # E4M3 keeps 3 mantissa bits (error up to 6%), E5M2 2 bits; sums average much of it out
    assert relative(y, y32) < 0.08
    assert relative(x.grad, x32.grad) < 0.15
    assert relative(layer.weight.grad, w32.grad) < 0.15


def test_scaled_mm_backend_matches_emulation_on_cpu():
    results = {}
    for backend in ("emulated", "scaled_mm"):
        layer, x, grad_y = _layer_and_data(recipe="delayed", backend=backend)
        outputs = []
        for _ in range(3):   # several steps, so the delayed scales are not all 1.0
            y = layer(x)
            y.backward(grad_y)
            outputs += [y.detach(), x.grad.clone(), layer.weight.grad.clone()]
            x.grad = layer.weight.grad = layer.bias.grad = None
        results[backend] = outputs
    for got, expected in zip(results["scaled_mm"], results["emulated"]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def _fp8_gpu_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _fp8_gpu_available(), reason="needs a CUDA GPU with FP8 tensor cores "
                    "(compute capability 8.9 or newer); this machine has none")
def test_scaled_mm_on_fp8_gpu_matches_emulation():
    torch.manual_seed(0)
    x = torch.randn(64, 128, device="cuda")
    grad_y = torch.randn(64, 96, device="cuda") * 1e-3
    results = {}
    for backend in ("emulated", "scaled_mm"):
        torch.manual_seed(1)
        layer = Fp8Linear(128, 96, recipe="current", backend=backend).cuda()
        xb = x.clone().requires_grad_()
        y = layer(xb)
        y.backward(grad_y)
        results[backend] = [y.detach(), xb.grad, layer.weight.grad]
    assert choose_backend("auto", "cuda") == "scaled_mm"
    for got, expected in zip(results["scaled_mm"], results["emulated"]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_backend_choice_and_fallback_warning():
    assert choose_backend("auto", "cpu") == "emulated"
    assert choose_backend("scaled_mm", "cpu") == "scaled_mm"
    assert choose_backend("auto", "cuda", capability=(9, 0)) == "scaled_mm"
    assert choose_backend("emulated", "cuda", capability=(8, 9)) == "emulated"
    for requested in ("auto", "scaled_mm"):
        with pytest.warns(Fp8EmulationWarning, match="8.0, so FP8 is emulated"):
            assert choose_backend(requested, "cuda", capability=(8, 0)) == "emulated"
    with pytest.raises(ValueError, match="unknown FP8 backend"):
        choose_backend("fast", "cpu")


def test_convert_to_fp8_keeps_parameters_and_tied_head():
    model = GPT(GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2))
    before = {name: p for name, p in model.named_parameters()}
    replaced = convert_to_fp8(model, skip=("head",))
    assert len(replaced) == 2 * 4 and "head" not in replaced
    assert all(isinstance(model.get_submodule(name), Fp8Linear) for name in replaced)
    assert {name: p for name, p in model.named_parameters()} == before  # the same Parameter objects
    assert model.head.weight is model.token_embedding.weight


def test_fp8_training_ends_within_10_percent_of_bf16():
    sizes = dict(d_model=32, n_layers=1, n_heads=2, seq_len=16, batch_size=8, steps=40,
                 vocab_size=64, lr=1e-2, eval_batches=2)
    fp8 = train(Fp8RunConfig(**sizes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # bf16 is not accelerated on every CPU; that is fine here
        bf16 = train(RunConfig(**sizes, precision="bf16", loss_scaling="off"))
    uniform = MarkovText(64).uniform_loss
    assert bf16.final_loss < uniform - 1.0, "the bf16 baseline should have learned something"
    assert fp8.final_loss < uniform - 1.0, f"FP8 run did not learn: {fp8.losses}"
    assert abs(fp8.final_loss - bf16.final_loss) <= 0.10 * bf16.final_loss
    assert fp8.losses[0] == pytest.approx(bf16.losses[0], rel=0.02), "same data and initial weights"
