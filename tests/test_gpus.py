"""The GPU classes learners meet: what each accelerates, the lab's choice and size there, and what
`mpcourse doctor` says, all with mocked device properties (no GPU is needed to run these).

The expected facts are NVIDIA's (datasheets and architecture whitepapers, see mpcourse.machine.gpus):
tensor cores for FP16 from Volta/Turing (sm_70/75), for TF32 and BF16 from Ampere (sm_80), FP8
from Ada and Hopper (sm_89, sm_90); a T4 runs bf16 only by emulation although torch reports it
supported; a P100 has no tensor cores but runs packed FP16 at twice its FP32 rate.
"""
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
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0), 79 * GiB, ("bf16", "fp16"), False),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 79 * GiB, ("bf16", "fp16"), True),
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
    assert size.device_type == "cuda" and size.compare == ("fp32",) + fast16
    c = size.config
    assert (c.d_model, c.n_layers, c.seq_len) == (768, 12, 1024), "GPT-2 small's shape"
    estimate = transformer_memory(c.d_model, c.n_layers, c.seq_len, c.batch_size, c.vocab_size, "fp32",
                                  "adamw", n_heads=c.n_heads).total
    assert estimate <= GPU_MEMORY_FRACTION * memory
    seconds = predicted_step_seconds(c, gpus.identify(name), "fp32")
    assert GPU_MIN_STEPS <= c.steps <= LESSON_CUDA_CONFIG.steps
    assert c.steps * seconds <= GPU_RUN_SECONDS or c.steps == GPU_MIN_STEPS


def test_the_predicted_step_is_the_model_flops_over_the_assumed_share_of_the_peak():
    """6 N per token plus attention (Kaplan et al.; nanoGPT's MFU), counted independently here."""
    c, t4 = LESSON_CUDA_CONFIG, gpus.gpu_class("T4")
    params = sum(p.numel() for p in torch.nn.Module.parameters(_gpt_on_meta(c)))
    flops = (6 * params + 12 * c.n_layers * c.d_model * c.seq_len) * c.batch_size * c.seq_len
    assert predicted_step_seconds(c, t4, "fp32") == pytest.approx(flops / (0.4 * 8.1e12))
    assert predicted_step_seconds(c, t4, "fp16") == pytest.approx(flops / (0.4 * 65e12))


def _gpt_on_meta(config):
    from mpcourse.train.models import GPT
    with torch.device("meta"):
        return GPT(config.model_config())


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
    ("A100", {"fp32": "yes", "tf32": "yes", "bf16": "yes", "fp16": "yes", "fp8": "no"}),
    ("H100", {"fp32": "yes", "tf32": "yes", "bf16": "yes", "fp16": "yes", "fp8": "yes"}),
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
    assert "the lab compares fp32 (TF32 off) with " + " and ".join(
        "fp16 (with a loss scaler)" if p == "fp16" else p for p in fast16) in out


def test_an_unknown_gpu_is_judged_by_its_compute_capability(fake_gpu):
    assert gpus.identify("NVIDIA Quadro GV100") is None
    table = gpus.precisions((7, 0))
    assert table["fp16"].accelerated and not table["bf16"].accelerated and not table["tf32"].supported
    assert gpus.precisions((12, 0))["fp8"].accelerated
    fake_gpu("NVIDIA Quadro GV100", (7, 0), 32 * GiB)
    assert lab_size("cuda").compare == ("fp32", "fp16")


def test_names_that_look_alike_are_told_apart():
    assert gpus.identify("NVIDIA L40S") is None
    assert gpus.identify("NVIDIA A100-PCIE-40GB").name == "A100"
    assert gpus.identify("NVIDIA A10").name == "A10G"
    assert gpus.identify("NVIDIA H200").name == "H100"
    with pytest.raises(ValueError, match="unknown GPU class 'V100'; the table has T4, P100"):
        gpus.gpu_class("V100")


@pytest.mark.parametrize("fast, compared", [((), ("fp32", "bf16")), (("bf16",), ("fp32", "bf16")),
                                            (("bf16", "fp16"), ("fp32", "bf16", "fp16"))])
def test_on_a_cpu_the_lab_always_compares_bf16_to_show_what_emulation_costs(fast, compared):
    from mpcourse.train.sizing import LabSize
    assert LabSize(LESSON_CUDA_CONFIG, "cpu", fast, "").compare == compared


def test_doctor_describes_a_gpu_of_unknown_memory_and_class():
    assert gpus.describe(gpus.gpu_class("T4"), (7, 5), None).startswith(
        "GPU class    T4: Turing, sm_75, memory unknown at 320 GB/s")
    assert "sm_70 alone; 34 GB" in gpus.describe(None, (7, 0), 34 * 10**9)
