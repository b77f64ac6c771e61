"""The GPU classes learners meet: what each accelerates, the lab's choice and size there, and what
`mpcourse doctor` says, all with mocked device properties (no GPU is needed to run these).

The expected facts are NVIDIA's (datasheets and architecture whitepapers, see mpcourse.machine.gpus):
tensor cores for FP16 from Volta/Turing (sm_70/75), for TF32 and BF16 from Ampere (sm_80), FP8
from Ada and Hopper (sm_89, sm_90); a T4 runs bf16 only by emulation although torch reports it
supported; a P100 has no tensor cores but runs packed FP16 at twice its FP32 rate.
"""
import re
from types import SimpleNamespace

import pytest
import torch

from mpcourse.machine import gpus, hardware
from mpcourse.cli import main
from mpcourse.train.sizing import (GPU_MEMORY_FRACTION, GPU_MIN_STEPS, GPU_RUN_SECONDS, lab_size,
                                    predicted_step_seconds)
from mpcourse.memory.accounting import transformer_memory
from mpcourse.train import LESSON_CUDA_CONFIG

GiB = 2**30
#: name as torch reports it, compute capability, total memory as torch reports it, and the facts:
#: which 16-bit formats have tensor cores (or a faster path) and whether FP8 matmuls exist.
DEVICES = {
    "T4": ("Tesla T4", (7, 5), 15 * GiB, ("fp16",), False),
    "P100": ("Tesla P100-PCIE-16GB", (6, 0), 16 * GiB, ("fp16",), False),
    "L4": ("NVIDIA L4", (8, 9), 22 * GiB, ("bf16", "fp16"), True),
    "A10G": ("NVIDIA A10G", (8, 6), 22 * GiB, ("bf16", "fp16"), False),
    "A100 40GB": ("NVIDIA A100-SXM4-40GB", (8, 0), 39 * GiB, ("bf16", "fp16"), False),
    "A100 80GB SXM": ("NVIDIA A100-SXM4-80GB", (8, 0), 79 * GiB, ("bf16", "fp16"), False),
    "H100 PCIe": ("NVIDIA H100 PCIe", (9, 0), 79 * GiB, ("bf16", "fp16"), True),
    "H100 NVL": ("NVIDIA H100 NVL", (9, 0), 93 * GiB, ("bf16", "fp16"), True),
    "H100 SXM": ("NVIDIA H100 80GB HBM3", (9, 0), 79 * GiB, ("bf16", "fp16"), True),
    "H200": ("NVIDIA H200", (9, 0), 140 * GiB, ("bf16", "fp16"), True),
    "B200": ("NVIDIA B200", (10, 0), 178 * GiB, ("bf16", "fp16"), True),
    "GB200": ("NVIDIA GB200", (10, 0), 184 * GiB, ("bf16", "fp16"), True),
    "RTX PRO 6000 Blackwell": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 95 * GiB,
                               ("bf16", "fp16"), True),
    "RTX 3090": ("NVIDIA GeForce RTX 3090", (8, 6), 24 * GiB, ("bf16", "fp16"), False),
    "RTX 4090": ("NVIDIA GeForce RTX 4090", (8, 9), 24 * GiB, ("bf16", "fp16"), True),
}


@pytest.fixture
def fake_gpu(monkeypatch):
    """This machine as one CUDA GPU with the given name, compute capability and memory."""
    def install(name, capability, memory, count=1):
        props = SimpleNamespace(name=name, major=capability[0], minor=capability[1], total_memory=memory)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    return install


@pytest.mark.parametrize("label", DEVICES)
def test_each_class_is_recognised_and_accelerates_what_nvidia_says(label):
    name, capability, _, fast16, fp8 = DEVICES[label]
    gpu = gpus.identify(name)
    assert gpu is not None and gpu.name.startswith(label) and gpu.compute_capability == capability
    table = gpus.precisions(capability, gpu)
    assert tuple(p for p in ("bf16", "fp16") if table[p].accelerated) == fast16
    assert table["fp8"].accelerated is fp8
    assert all(table[p].supported for p in ("fp32", "bf16", "fp16")), "each runs, if only emulated"


@pytest.mark.parametrize("label", DEVICES)
def test_the_lab_compares_the_fast_precisions_at_a_size_that_fits_memory_and_time(label, fake_gpu):
    name, capability, memory, fast16, _ = DEVICES[label]
    fake_gpu(name, capability, memory)
    size = lab_size("cuda")
    # TF32 where its tensor cores beat FP32: from Ampere on, not the GeForce cards (same rate)
    tf32 = ("tf32",) if gpus.precisions(capability, gpus.identify(name))["tf32"].accelerated else ()
    assert size.device_type == "cuda" and size.compare == ("fp32",) + tf32 + fast16
    c = size.config
    assert (c.d_model, c.n_layers, c.seq_len) == (768, 12, 1024), "GPT-2 small's shape"
    estimate = transformer_memory(c.d_model, c.n_layers, c.seq_len, c.batch_size, c.vocab_size, "fp32",
                                  "adamw", n_heads=c.n_heads).total
    assert estimate <= GPU_MEMORY_FRACTION * memory
    seconds = predicted_step_seconds(c, gpus.identify(name), "fp32")
    assert GPU_MIN_STEPS <= c.steps <= LESSON_CUDA_CONFIG.steps
    assert c.steps * seconds <= GPU_RUN_SECONDS or c.steps == GPU_MIN_STEPS


def test_the_predicted_step_is_the_model_flops_over_the_assumed_share_of_the_peak():
    """Hand derivation for the course's GPT: 2 FLOPs per matmul weight forward (12 d^2 per layer,
    V d for the tied output layer), causal attention 2 d T per layer (half of Q K^T and A V's
    4 d T), and backward twice the forward."""
    c, t4 = LESSON_CUDA_CONFIG, gpus.gpu_class("T4")
    L, d, T, V = c.n_layers, c.d_model, c.seq_len, c.vocab_size
    flops = 3 * (2 * (12 * L * d * d + V * d) + 2 * L * d * T) * c.batch_size * T
    assert predicted_step_seconds(c, t4, "fp32") == pytest.approx(flops / (0.4 * 8.1e12))
    assert predicted_step_seconds(c, t4, "fp16") == pytest.approx(flops / (0.4 * 65e12))


def test_the_flop_count_is_torchs_flop_counter_with_half_the_attention():
    """torch.utils.flop_counter counts every matmul of a training step; with SDPA's math backend it
    also counts Q K^T and A V in full, masked half included. The causal count keeps half of that."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    from mpcourse.machine.performance import gpt_training_flops
    from mpcourse.train.models import GPT, GPTConfig, next_token_loss
    config = GPTConfig(vocab_size=256, seq_len=64, d_model=64, n_layers=3, n_heads=4)
    torch.manual_seed(0)
    model, tokens = GPT(config), torch.randint(256, (2, 64))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        next_token_loss(model(tokens), tokens).backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    matmuls, attention = counts["aten.mm"] + counts["aten.addmm"], counts["aten.bmm"]
    per_token = gpt_training_flops(config.n_layers, config.d_model, config.seq_len, config.vocab_size)
    assert per_token * tokens.numel() == matmuls + attention // 2


def test_a_small_gpu_gets_a_smaller_batch_and_a_tiny_one_a_clear_error(fake_gpu):
    fake_gpu("Tesla T4", (7, 5), 4 * GiB)
    small = lab_size("cuda").config
    c = LESSON_CUDA_CONFIG
    assert 1 <= small.batch_size < c.batch_size
    fits = [transformer_memory(c.d_model, c.n_layers, c.seq_len, b, c.vocab_size, "fp32", "adamw",
                               n_heads=c.n_heads).total <= GPU_MEMORY_FRACTION * 4 * GiB
            for b in (small.batch_size, small.batch_size + 1)]
    assert fits == [True, False], "the largest batch that fits, not a smaller one"
    fake_gpu("Tesla T4", (7, 5), GiB)
    with pytest.raises(ValueError, match="does not fit 1.1 GB even at batch 1"):
        lab_size("cuda")


def test_t4_the_lab_is_fp32_against_fp16_with_a_scaler_and_bf16_is_named_emulated(fake_gpu):
    fake_gpu(*DEVICES["T4"][:3])
    size = lab_size("cuda")
    assert size.compare == ("fp32", "fp16")
    assert "fp16 (with a loss scaler)" in size.reason and "leaves out bf16, emulated here" in size.reason
    how = hardware.report().precisions["bf16"]
    assert how.supported and not how.accelerated and "is_bf16_supported() says True" in how.how


@pytest.mark.parametrize("label, accelerated", [
    ("T4", {"fp32": "yes", "tf32": "no", "bf16": "no", "fp16": "yes", "fp8": "no"}),
    ("L4", {"fp32": "yes", "tf32": "yes", "bf16": "yes", "fp16": "yes", "fp8": "yes"}),
    ("A100 40GB", {"fp32": "yes", "tf32": "yes", "bf16": "yes", "fp16": "yes", "fp8": "no"}),
    ("H100 SXM", {"fp32": "yes", "tf32": "yes", "bf16": "yes", "fp16": "yes", "fp8": "yes"}),
    ("B200", {"fp32": "yes", "tf32": "yes", "bf16": "yes", "fp16": "yes", "fp8": "yes"}),
    ("RTX PRO 6000 Blackwell", {"fp32": "yes", "tf32": "yes", "bf16": "yes", "fp16": "yes", "fp8": "yes"}),
])
def test_doctor_prints_the_accelerated_precisions_and_explains_the_lab(label, accelerated, fake_gpu, capsys):
    name, capability, memory, fast16, _ = DEVICES[label]
    fake_gpu(name, capability, memory)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in accelerated and len(line.split()) > 2}
    assert rows == accelerated
    assert f"GPU class    {gpus.identify(name).name}" in out
    tf32 = gpus.precisions(capability, gpus.identify(name))["tf32"].accelerated
    baselines = "fp32 (TF32 off) and tf32" if tf32 else "fp32 (TF32 off)"
    assert f"the lab compares {baselines} with " + " and ".join(
        "fp16 (with a loss scaler)" if p == "fp16" else p for p in fast16) in out


def test_an_unknown_gpu_is_judged_by_its_compute_capability(fake_gpu):
    assert gpus.identify("NVIDIA Quadro GV100") is None
    table = gpus.precisions((7, 0))
    assert table["fp16"].accelerated and not table["bf16"].accelerated and not table["tf32"].supported
    assert gpus.precisions((12, 0))["fp8"].accelerated
    fake_gpu("NVIDIA Quadro GV100", (7, 0), 32 * GiB)
    assert lab_size("cuda").compare == ("fp32", "fp16")


def test_an_unknown_gpu_gets_a_not_in_the_table_line_from_doctor_and_a_lab_that_measures(fake_gpu, capsys):
    """An L40S (sm_89) is not in the table: doctor names it with its capability, the lab keeps its
    configured steps (no datasheet peak to predict one from) and still fits its memory."""
    fake_gpu("NVIDIA L40S", (8, 9), 44 * GiB)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "GPU class    NVIDIA L40S (sm_89, 47 GB) is not in the table of mpcourse.machine.gpus" in out
    size = lab_size("cuda")
    assert size.config.steps == LESSON_CUDA_CONFIG.steps and size.compare == ("fp32", "tf32", "bf16", "fp16")
    assert "NVIDIA L40S (sm_89) is not in mpcourse.machine.gpus's table" in size.reason


def test_names_that_look_alike_are_told_apart():
    named = {"NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": "H100 NVL",
             "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H200": "H200", "NVIDIA H200 NVL": "H200 NVL",
             "NVIDIA A100-SXM4-40GB": "A100 40GB", "NVIDIA A100-PCIE-40GB": "A100 40GB",
             "NVIDIA A100-SXM4-80GB": "A100 80GB SXM", "NVIDIA A100 80GB PCIe": "A100 80GB PCIe",
             "NVIDIA B200": "B200", "NVIDIA GB200": "GB200", "NVIDIA A10": "A10G",
             "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTX PRO 6000 Blackwell"}
    assert {name: gpus.identify(name).name for name in named} == named
    assert gpus.identify("NVIDIA L40S") is None and gpus.identify("NVIDIA GH200 480GB") is None
    with pytest.raises(ValueError, match="unknown GPU class 'V100'; the table has T4, P100"):
        gpus.gpu_class("V100")


#: The datasheet figures, typed from each datasheet the class names: TFLOPS (tensor cores "with
#: sparsity" where the datasheet says so, halved by the table) and memory bandwidth in GB/s.
DATASHEETS = {
    "A100 40GB": (dict(fp32=19.5, tf32=156, bf16=312), False, 1555),
    "A100 80GB SXM": (dict(fp32=19.5, tf32=156, bf16=312), False, 2039),
    "H100 PCIe": (dict(fp32=51, tf32=756, bf16=1513, fp8=3026), True, 2000),
    "H100 NVL": (dict(fp32=60, tf32=835, bf16=1671, fp8=3341), True, 3900),
    "H100 SXM": (dict(fp32=67, tf32=989, bf16=1979, fp8=3958), True, 3350),
    "H200": (dict(fp32=67, tf32=989, bf16=1979, fp8=3958), True, 4800),
    "B200": (dict(fp32=75, tf32=2200, bf16=4500, fp8=9000), True, 7700),
    "GB200": (dict(fp32=80, tf32=2500, bf16=5000, fp8=10000), True, 8000),
}


@pytest.mark.parametrize("name", DATASHEETS)
def test_each_class_holds_its_own_datasheets_dense_peaks_and_bandwidth(name):
    tflops, sparse, bandwidth = DATASHEETS[name]
    device = gpus.gpu_class(name).device
    dense = {p: (t / 2 if sparse and p != "fp32" else t) for p, t in tflops.items()}
    assert {p: device.peak(p) / 1e12 for p in dense} == pytest.approx(dense, rel=1e-3)
    assert device.bandwidth == pytest.approx(bandwidth * 1e9, rel=1e-3)


def test_every_class_names_a_datasheet_or_whitepaper_with_its_year():
    for gpu in gpus.CLASSES:
        assert re.search(r"NVIDIA .*(datasheet|whitepaper) \(\d{4}", gpu.source), gpu.name
    h100s = [g for g in gpus.CLASSES if g.name.startswith("H100")]
    assert len({(tuple(g.device.peak_flops.values()), g.device.bandwidth) for g in h100s}) == 3


@pytest.mark.parametrize("name, precision, peak_tflops", [
    ("B200", "bf16", 2250), ("H100 PCIe", "bf16", 756.5), ("H100 SXM", "tf32", 494.5),
    ("RTX PRO 6000 Blackwell", "fp32", 120), ("T4", "fp16", 65)])
def test_mfu_divides_by_the_classs_own_peak_for_the_precision(name, precision, peak_tflops):
    assert gpus.gpu_class(name).mfu(0.5 * peak_tflops * 1e12, precision) == pytest.approx(0.5)


def test_mfu_is_none_where_the_datasheet_has_no_peak():
    assert gpus.gpu_class("T4").mfu(1e12, "bf16") is None
    assert gpus.gpu_class("A100 40GB").mfu(1e12, "fp8") is None


@pytest.mark.parametrize("fast, compared", [((), ("fp32", "bf16")), (("bf16",), ("fp32", "bf16")),
                                            (("bf16", "fp16"), ("fp32", "bf16", "fp16"))])
def test_on_a_cpu_the_lab_always_compares_bf16_to_show_what_emulation_costs(fast, compared):
    from mpcourse.train.sizing import LabSize
    assert LabSize(LESSON_CUDA_CONFIG, "cpu", fast, "").compare == compared


def test_doctor_describes_a_gpu_of_unknown_memory_and_class():
    assert gpus.describe("Tesla T4", (7, 5), None).startswith(
        "GPU class    T4: Turing, sm_75, memory unknown at 320 GB/s")
    assert "NVIDIA Quadro GV100 (sm_70, 34 GB) is not in the table" in gpus.describe(
        "NVIDIA Quadro GV100", (7, 0), 34 * 10**9)
