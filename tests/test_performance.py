"""The roofline model's counts against torch's own FLOP counter and tensors' own byte sizes,
its classifications against the ridge point, the tensor-core shape rule, and the profiler check."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mpcourse.machine.performance import (A100_SXM, H100_SXM, Device, KernelCall, Work, elementwise_work,
                                           kernels_that_ran, matmul_work, padded, tensor_core_friendly,
                                           tensor_core_multiple)

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)
DEVICES = (A100_SXM, H100_SXM)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (64, 32, 48), (7, 300, 5), (1, 4096, 4096)])
def test_matmul_flops_match_torchs_flop_counter(m, n, k):
    a, b = torch.randn(m, k), torch.randn(k, n)
    with FlopCounterMode(display=False) as counter:
        a @ b
    assert matmul_work(m, n, k, torch.float32).flops == counter.get_total_flops() == 2 * m * n * k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_bytes_are_its_operands_and_result_once_each(dtype):
    m, n, k = 24, 40, 56
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    c = a @ b
    assert matmul_work(m, n, k, dtype).bytes_moved == a.nbytes + b.nbytes + c.nbytes


def test_square_matmul_intensity_grows_with_n():
    # 2n^3 FLOPs over 3n^2 elements of 2 bytes: n/3 FLOP per byte in 16 bits, n/6 in FP32.
    for n in (64, 512, 8192):
        assert matmul_work(n, n, n, torch.bfloat16).intensity == pytest.approx(n / 3)
        assert matmul_work(n, n, n, torch.float32).intensity == pytest.approx(n / 6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_elementwise_bytes_match_the_tensors_touched(dtype):
    x = torch.randn(1000).to(dtype)
    y = torch.randn(1000).to(dtype)
    add = elementwise_work(x.numel(), dtype, reads=2, writes=1)
    assert add.bytes_moved == x.nbytes + y.nbytes + x.nbytes
    assert add.flops == 1000


def test_elementwise_flops_match_torchs_counter_for_an_op_it_counts():
    # FlopCounterMode counts matmul-like ops only; an element-wise op is 0 FLOPs to it, so
    # check the counter's blind spot instead of pretending it agrees.
    x = torch.randn(100)
    with FlopCounterMode(display=False) as counter:
        x * 2
    assert counter.get_total_flops() == 0
    assert elementwise_work(100, torch.float32).flops == 100


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_elementwise_ops_are_memory_bound_at_every_dtype_and_roof(device, dtype):
    for reads in (1, 2, 3):
        work = elementwise_work(1 << 24, dtype, reads=reads, flops_per_element=4)
        for precision in device.peak_flops:
            assert device.memory_bound(work, precision), (device.name, dtype, precision)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
def test_16_bits_halve_an_elementwise_ops_time_through_bytes(device):
    fp32 = elementwise_work(1 << 24, torch.float32, reads=2)
    bf16 = elementwise_work(1 << 24, torch.bfloat16, reads=2)
    assert fp32.flops == bf16.flops
    assert device.time_bound(fp32, "fp32") == pytest.approx(2 * device.time_bound(bf16, "bf16"))
    assert device.time_bound(fp32, "fp32") == device.memory_seconds(fp32)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
def test_a_large_matmul_gains_the_ratio_of_the_peaks(device):
    fp32 = matmul_work(8192, 8192, 8192, torch.float32)
    bf16 = matmul_work(8192, 8192, 8192, torch.bfloat16)
    for precision, work in (("fp32", fp32), ("tf32", fp32), ("bf16", bf16)):
        assert not device.memory_bound(work, precision)
        assert device.time_bound(work, precision) == device.compute_seconds(work, precision)
    speedup_over_fp32 = device.time_bound(fp32, "fp32") / device.time_bound(bf16, "bf16")
    speedup_over_tf32 = device.time_bound(fp32, "tf32") / device.time_bound(bf16, "bf16")
    assert speedup_over_fp32 == pytest.approx(device.peak("bf16") / device.peak("fp32"))
    assert speedup_over_fp32 > 14, "against FP32 on CUDA cores, bf16 tensor cores win big"
    assert speedup_over_tf32 == pytest.approx(2, rel=0.01), "against TF32, only about 2x"


def test_a_matrix_vector_product_is_memory_bound_even_in_bf16():
    gemv = matmul_work(1, 4096, 4096, torch.bfloat16)
    assert gemv.intensity < 1
    for device in DEVICES:
        assert device.memory_bound(gemv, "bf16")


def test_roofline_and_ridge_point():
    device = Device("toy", {"fp32": 100.0}, bandwidth=10.0)
    assert device.ridge_point("fp32") == 10.0
    assert device.attainable_flops(1.0, "fp32") == 10.0
    assert device.attainable_flops(10.0, "fp32") == 100.0
    assert device.attainable_flops(1e6, "fp32") == 100.0
    work = Work("w", flops=1000, bytes_moved=50)  # intensity 20: compute-bound
    assert device.time_bound(work, "fp32") == 10.0 and not device.memory_bound(work, "fp32")
    work = Work("w", flops=100, bytes_moved=50)   # intensity 2: memory-bound
    assert device.time_bound(work, "fp32") == 5.0 and device.memory_bound(work, "fp32")


def test_datasheet_devices_are_consistent():
    for device in DEVICES:
        assert device.peak("bf16") == device.peak("fp16")
        # The datasheets round each figure on its own, so TF32 is half of BF16 to 0.1%.
        assert device.peak("bf16") == pytest.approx(2 * device.peak("tf32"), rel=1e-3)
        assert device.peak("tf32") > device.peak("fp32")
    assert H100_SXM.peak("fp8") == 2 * H100_SXM.peak("bf16")
    with pytest.raises(ValueError, match="no 'fp8' peak"):
        A100_SXM.peak("fp8")


@pytest.mark.parametrize("dtype, multiple", [(torch.float32, 4), (torch.bfloat16, 8), (torch.float16, 8),
                                             (torch.float8_e4m3fn, 16), (torch.float8_e5m2, 16)])
def test_tensor_core_multiple_is_16_bytes_of_elements(dtype, multiple):
    assert tensor_core_multiple(dtype) == multiple
    assert tensor_core_friendly((multiple, 2 * multiple, 64 * multiple), dtype)
    assert not tensor_core_friendly((multiple, multiple + 1, multiple), dtype)


def test_gpt2_vocabulary_is_padded_to_a_friendly_size():
    assert not tensor_core_friendly((50257, 768, 768), torch.bfloat16)
    assert padded(50257, torch.bfloat16) == 50264
    assert tensor_core_friendly((padded(50257, torch.bfloat16), 768, 768), torch.bfloat16)
    assert padded(50304, torch.bfloat16) == 50304
    assert padded(3, torch.float8_e4m3fn) == 16


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="float64"):
        tensor_core_multiple(torch.float64)
    with pytest.raises(ValueError, match="int32"):
        matmul_work(2, 2, 2, torch.int32)
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        matmul_work(2, 2, 0, torch.float32)
    with pytest.raises(ValueError, match="reads must be a positive int, got 0"):
        elementwise_work(10, torch.float32, reads=0)
    with pytest.raises(ValueError, match=r"shape\[1\] must be a positive int, got -8"):
        tensor_core_friendly((8, -8), torch.float16)


def _matmul_inputs(calls: list[KernelCall]) -> list[tuple[torch.dtype, ...]]:
    return [c.input_dtypes for c in calls if c.name in ("aten::mm", "aten::addmm")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_that_ran_sees_the_matmuls_input_dtypes(dtype):
    a, b = torch.randn(32, 32).to(dtype), torch.randn(32, 32).to(dtype)
    calls = kernels_that_ran(lambda: a @ b)
    assert _matmul_inputs(calls) == [(dtype, dtype)]
    assert all(c.device == "cpu" for c in calls)
    assert "aten::matmul" in [c.name for c in calls]


def test_kernels_that_ran_shows_autocast_sending_an_fp32_linear_to_bf16():
    layer = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    plain = kernels_that_ran(lambda: layer(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = kernels_that_ran(lambda: layer(x))
    assert _matmul_inputs(plain) == [(torch.float32,) * 3]
    assert _matmul_inputs(autocast) == [(torch.bfloat16,) * 3]
    assert "aten::_to_copy" in [c.name for c in autocast], "autocast's casts show up too"
    assert str(KernelCall("aten::mm", "cpu", (torch.bfloat16,) * 2)) == "aten::mm [cpu] (bfloat16, bfloat16)"


def test_kernels_that_ran_rejects_a_non_callable():
    with pytest.raises(TypeError, match=r"needs a function to call, got tensor"):
        kernels_that_ran(torch.ones(2) @ torch.ones(2))


def test_kernels_that_ran_records_shapes_and_matmul_dims():
    a, b, bias = torch.randn(24, 40), torch.randn(40, 56), torch.randn(56)
    batched = torch.randn(3, 24, 40)
    calls = kernels_that_ran(lambda: (torch.addmm(bias, a, b), a @ b, batched @ torch.randn(3, 40, 56)))
    dims = {c.name: c.matmul_dims() for c in calls if c.name in ("aten::mm", "aten::addmm", "aten::bmm")}
    assert dims == {"aten::mm": (24, 56, 40), "aten::addmm": (24, 56, 40), "aten::bmm": (24, 56, 40)}
    addmm = next(c for c in calls if c.name == "aten::addmm")
    assert addmm.input_shapes == ((56,), (24, 40), (40, 56))
    with pytest.raises(ValueError, match="aten::add is not one of the matmuls"):
        KernelCall("aten::add", "cpu", (torch.float32,), ((2,),)).matmul_dims()
