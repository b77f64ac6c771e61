"""The lab's size: the decision from faked flags and probes, the calibration's shape, the CLI's
JSON and errors. No test asserts a speed: the probe's timings are faked wherever a decision is."""
import json

import pytest
import torch

from mpcourse.machine import hardware
from mpcourse.cli import main
from mpcourse.machine.hardware import FAST_SPEEDUP
from mpcourse.train.sizing import REFERENCE, choose_lab_size, lab_size
from mpcourse.train import LESSON_CPU_CONFIG, LESSON_CPU_MATMUL_CONFIG, LESSON_CUDA_CONFIG

AVX512_BF16 = hardware.cpu_precisions(frozenset({"avx512_bf16"}))
AVX2_ONLY = hardware.cpu_precisions(frozenset({"avx2"}))
AMX_FP16 = hardware.cpu_precisions(frozenset({"amx_bf16", "amx_fp16"}))


def probe(bf16: float, fp16: float) -> hardware.MatmulProbe:
    """A faked calibration in which bf16 and fp16 ran `bf16` and `fp16` times as fast as fp32."""
    return hardware.MatmulProbe(256, {"fp32": 1e-3, "bf16": 1e-3 / bf16, "fp16": 1e-3 / fp16})


def test_bf16_measured_fast_sizes_the_lab_for_matmuls():
    size = choose_lab_size("cpu", AVX512_BF16, probe(bf16=2.5, fp16=0.02))
    assert size.config == LESSON_CPU_MATMUL_CONFIG and size.fast == ("bf16",)
    assert "bf16 2.5x (avx512_bf16)" in size.reason and "d_model 512" in size.reason


def test_emulated_16_bit_keeps_the_lab_small_and_says_so():
    size = choose_lab_size("cpu", AVX2_ONLY, probe(bf16=0.02, fp16=0.01))
    assert size.config == LESSON_CPU_CONFIG and size.fast == ()
    assert "bf16 is emulated, 0.02x" in size.reason and "fp16 is emulated, 0.01x" in size.reason
    assert "stays small (d_model 32)" in size.reason


def test_flags_without_fast_kernels_keep_the_lab_small_and_name_the_cause():
    """ONEDNN_MAX_CPU_ISA=AVX2 on an AVX512-BF16 CPU: the flags promise, the probe disagrees."""
    size = choose_lab_size("cpu", AVX512_BF16, probe(bf16=0.02, fp16=0.01))
    assert size.config == LESSON_CPU_CONFIG
    assert "although the CPU has avx512_bf16" in size.reason and "ONEDNN_MAX_CPU_ISA" in size.reason


@pytest.mark.parametrize("speedup, fast", [(FAST_SPEEDUP, True), (FAST_SPEEDUP * 0.99, False)])
def test_the_threshold_is_inclusive(speedup, fast):
    size = choose_lab_size("cpu", AVX512_BF16, probe(bf16=speedup, fp16=0.01))
    assert (size.config == LESSON_CPU_MATMUL_CONFIG) == fast


def test_fp32_is_always_fast_being_the_baseline():
    assert hardware.is_fast("fp32", probe(bf16=0.01, fp16=0.01))
    assert not hardware.is_fast("bf16", probe(bf16=0.01, fp16=0.01))


def test_fast_fp16_counts_too():
    size = choose_lab_size("cpu", AMX_FP16, probe(bf16=3.0, fp16=2.8))
    assert size.fast == ("bf16", "fp16") and size.config == LESSON_CPU_MATMUL_CONFIG


def test_gpus_and_bad_input():
    ampere = hardware.cuda_precisions((8, 0))
    cuda = choose_lab_size("cuda", ampere)
    assert cuda.config == LESSON_CUDA_CONFIG and cuda.fast == ("bf16", "fp16")
    assert choose_lab_size("mps", AVX2_ONLY).config == LESSON_CPU_CONFIG
    with pytest.raises(ValueError, match="unknown device type 'tpu'; choose cuda, mps or cpu"):
        choose_lab_size("tpu", ampere)
    with pytest.raises(ValueError, match="needs the matmul probe"):
        choose_lab_size("cpu", AVX512_BF16)
    with pytest.raises(ValueError, match="unknown device 'gpu'; choose auto, cpu, cuda or mps"):
        lab_size("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' is not available here"):
            lab_size("cuda")


def test_the_calibration_times_each_precision_on_one_thread_and_restores_the_threads():
    before = torch.get_num_threads()
    result = hardware.probe_matmuls(n=32, repeats=2)
    assert torch.get_num_threads() == before
    assert result.n == 32 and set(result.seconds) == {"fp32", "bf16", "fp16"}
    assert all(s > 0 for s in result.seconds.values())
    assert result.speedup("fp32") == 1.0
    with pytest.raises(ValueError, match="did not time 'fp8'; it timed fp32, bf16, fp16"):
        result.speedup("fp8")
    with pytest.raises(ValueError, match="repeats=0"):
        hardware.probe_matmuls(repeats=0)
    assert hardware.measured_probe() is hardware.measured_probe(), "one calibration per process"


@pytest.fixture
def fake_cpu(monkeypatch):
    """This machine as a CPU with the given flags and calibration (no CUDA, no timing)."""
    def install(flags, calibration):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(hardware, "measured_probe", lambda: calibration)
    return install


def test_lab_size_decides_from_this_machines_flags_and_probe(fake_cpu):
    fake_cpu({"avx2"}, probe(bf16=0.03, fp16=0.01))
    assert lab_size().config == LESSON_CPU_CONFIG
    fake_cpu({"avx512_bf16"}, probe(bf16=2.0, fp16=0.01))
    assert lab_size("cpu").config == LESSON_CPU_MATMUL_CONFIG


def test_doctor_says_the_lab_size_and_why(fake_cpu, capsys):
    fake_cpu({"avx2"}, probe(bf16=0.03, fp16=0.01))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "The lab's size here (lesson 06, mpcourse train and compare): d_model 32, 2 layers" in out
    assert "bf16 is emulated, 0.03x" in out


TINY_FLAGS = ["--d-model", "16", "--layers", "1", "--heads", "2", "--batch", "2", "--seq-len", "8",
              "--steps", "3", "--device", "cpu"]
RUN_KEYS = {"precision", "tokens_per_s", "final_loss", "eval_loss", "peak_memory_bytes", "accelerated"}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.filterwarnings("ignore::mpcourse.train.UnacceleratedPrecisionWarning")
def test_compare_json_prints_one_object_with_a_record_per_run(fake_cpu, tmp_path, capsys):
    fake_cpu({"avx2"}, probe(bf16=0.03, fp16=0.01))
    png = tmp_path / "curves.png"
    assert main(["compare", "--precisions", "fp32,bf16", "--json", "--out", str(png), *TINY_FLAGS]) == 0
    captured = capsys.readouterr()
    runs = json.loads(captured.out)["runs"]
    assert [set(run) for run in runs] == [RUN_KEYS, RUN_KEYS]
    assert [(r["precision"], r["accelerated"]) for r in runs] == [("fp32", True), ("bf16", False)]
    for run in runs:
        assert run["tokens_per_s"] > 0 and run["eval_loss"] > 0 and run["final_loss"] > 0
        assert isinstance(run["peak_memory_bytes"], int) and run["peak_memory_bytes"] > 0
    assert "bf16 is emulated" in captured.err, "the sizing reason goes to stderr, beside the JSON"
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    (["--precisions", "fp32,fp64"], "mpcourse compare: error: argument --precisions: unknown precision 'fp64' (allowed: fp32"),
    (["--device", "tpu"], "mpcourse compare: error: argument --device: unknown device 'tpu' (allowed: auto, cpu, cuda"),
    (["--threads", "0"], "mpcourse compare: error: argument --threads: 0 is too small (allowed: 1 or more)"),
])
def test_compare_rejects_bad_input_by_name(fake_cpu, capsys, args, message):
    fake_cpu({"avx2"}, probe(bf16=0.03, fp16=0.01))
    assert main(["compare", *args]) == 2
    assert message in capsys.readouterr().err


def test_json_record_turns_a_missing_speed_into_null():
    from mpcourse.cli import run_record
    from mpcourse.train import RunResult
    untimed = RunResult(LESSON_CPU_CONFIG, "cpu", True, losses=[5.0], step_seconds=[1.0], timed=[False],
                        eval_loss=4.0, peak_memory_bytes=10)
    record = run_record(untimed)
    assert record["tokens_per_s"] is None and record["final_loss"] == 5.0
    assert json.loads(json.dumps(record)) == record


def test_reference_was_measured_at_the_labs_size_on_a_machine_named_and_dated():
    assert REFERENCE.config == LESSON_CPU_MATMUL_CONFIG, "re-record the reference after resizing the lab"
    assert [run.precision for run in REFERENCE.runs][0] == "fp32" and REFERENCE.speedup("fp32") == 1.0
    table = REFERENCE.table()
    assert REFERENCE.machine in table and REFERENCE.date in table
    assert len(table.splitlines()) == 4 + len(REFERENCE.runs)
    with pytest.raises(ValueError, match="no 'fp8' run"):
        REFERENCE.speedup("fp8")


def test_a_gpu_with_tf32_compares_against_fp32_and_tf32():
    """Issue 43: the GPU lab reports a TF32 row beside FP32 (TF32 tensor cores from sm_80 on), and a
    T4 (sm_75, no TF32) keeps true FP32 as its one baseline."""
    ampere = choose_lab_size("cuda", hardware.cuda_precisions((8, 0)))
    assert ampere.compare == ("fp32", "tf32", "bf16", "fp16")
    assert "fp32 (TF32 off) and tf32 with" in ampere.reason
    turing = choose_lab_size("cuda", hardware.cuda_precisions((7, 5)))
    assert turing.compare[0] == "fp32" and "tf32" not in turing.compare
