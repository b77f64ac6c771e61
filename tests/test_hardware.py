"""hardware.report on this CPU and on a faked CUDA GPU, and the `mpcourse` command line."""
import dataclasses
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
from grading_budgets import program_backstop

from mpcourse.machine import cpu_profiles, hardware
from mpcourse.cli import main
from mpcourse.course import LESSONS


def test_cpu_report_describes_this_machine():
    r = hardware.report()
    assert r.device_type == ("cuda" if torch.cuda.is_available() else r.device_type)
    assert r.torch_version == torch.__version__ and r.threads == torch.get_num_threads()
    assert set(r.precisions) == set(hardware.PRECISIONS)
    assert r.precisions["fp32"].supported and r.precisions["fp32"].accelerated
    if r.device_type == "cpu":
        assert not r.precisions["tf32"].supported
        flags = hardware.cpu_flags()
        assert r.precisions["bf16"].accelerated == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


@pytest.mark.parametrize("flags, bf16, fp16", [
    (frozenset(), False, False),
    (frozenset({"avx2", "avx512_bf16"}), True, False),
    (frozenset({"amx_bf16", "amx_fp16"}), True, True),
    (frozenset({"fphp", "asimdhp"}), False, True),
])
def test_cpu_acceleration_follows_the_instruction_set(flags, bf16, fp16):
    p = hardware.cpu_precisions(flags)
    assert (p["bf16"].accelerated, p["fp16"].accelerated) == (bf16, fp16)
    assert p["bf16"].supported and p["fp16"].supported and not p["fp8"].accelerated
    if not bf16:
        assert "emulated" in p["bf16"].how


@pytest.fixture
def fake_cuda(monkeypatch):
    def install(name, capability):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=0: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=0: capability)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device=0: SimpleNamespace(name=name, total_memory=16 * 2**30))
    return install


@pytest.mark.parametrize("capability, tf32, bf16, fp16, fp8", [
    ((9, 0), True, True, True, True),     # Hopper
    ((8, 9), True, True, True, True),     # Ada
    ((8, 0), True, True, True, False),    # Ampere
    ((7, 5), False, False, True, False),  # Turing
    ((6, 1), False, False, False, False),  # Pascal: fp16 runs without tensor cores
])
def test_cuda_report_follows_compute_capability(fake_cuda, capability, tf32, bf16, fp16, fp8):
    fake_cuda("NVIDIA Test GPU", capability)
    r = hardware.report()
    assert (r.device_type, r.device_name, r.compute_capability) == ("cuda", "NVIDIA Test GPU", capability)
    p = r.precisions
    assert (p["tf32"].accelerated, p["bf16"].accelerated, p["fp16"].accelerated, p["fp8"].accelerated) == \
        (tf32, bf16, fp16, fp8)
    assert p["fp16"].supported and p["bf16"].supported, "bf16 runs on any CUDA GPU, emulated before sm_80"
    lab = next(lesson for lesson in LESSONS if lesson.number == "06")
    fp8_lesson = next(lesson for lesson in LESSONS if lesson.number == "07")
    assert r.full_size(lab) and r.full_size(fp8_lesson) == fp8
    assert hardware.scaled(cpu=1, cuda=2) == 2


def test_doctor_prints_the_faked_gpu(fake_cuda, capsys):
    fake_cuda("NVIDIA H100 80GB HBM3", (9, 0))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3 (compute capability 9.0)" in out
    assert "06 The mixed-precision training lab    full size" in out


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mpcourse.cli", *args], capture_output=True, text=True,
                          timeout=program_backstop())


def test_doctor_exits_zero_on_this_machine():
    result = _cli("doctor")
    assert result.returncode == 0, result.stderr
    for name in hardware.PRECISIONS:
        assert f"\n{name} " in result.stdout
    assert "Lessons on this machine:" in result.stdout


@pytest.mark.parametrize("args", [["frobnicate"], []])
def test_unknown_or_missing_subcommand_prints_usage_and_exits_2(args):
    result = _cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("mpcourse: error:") and len(result.stderr.splitlines()) == 1
    if args:
        assert "invalid choice: 'frobnicate' (choose from 'doctor'," in result.stderr
    else:
        assert "the following arguments are required: COMMAND" in result.stderr


@pytest.mark.parametrize("flags, dtype, faster", [
    (frozenset(), "bf16", False),
    (frozenset({"avx512_bf16"}), "bf16", True),
    (frozenset({"avx512_bf16"}), "fp16", False),
    (frozenset({"amx_bf16", "amx_fp16"}), "fp16", True),
])
def test_autocast_speed_prediction_follows_the_report(flags, dtype, faster):
    report = dataclasses.replace(hardware.report(), precisions=hardware.cpu_precisions(flags))
    prediction = hardware.predict_autocast_speed(report, dtype)
    assert prediction.faster_than_fp32 == faster == report.precisions[dtype].accelerated
    assert (prediction.dtype, prediction.device_type) == (dtype, report.device_type)
    assert report.precisions[dtype].how in prediction.reason
    assert ("to be faster" if faster else "to be slower") in prediction.reason


def test_autocast_speed_prediction_here_and_bad_dtype():
    here = hardware.report()
    assert hardware.predict_autocast_speed(here).faster_than_fp32 == here.precisions["bf16"].accelerated
    with pytest.raises(ValueError, match="'fp8'"):
        hardware.predict_autocast_speed(here, "fp8")


# --- MPCOURSE_HARDWARE: a recorded CPU instead of this one -----------------------------------------

@pytest.mark.parametrize("profile, bf16, fp16", [("avx2", False, False), ("avx512-bf16", True, False),
                                                 ("amx", True, True), ("arm", True, True)])
def test_a_profile_replaces_the_flags_and_the_calibration(monkeypatch, profile, bf16, fp16):
    monkeypatch.setenv("MPCOURSE_HARDWARE", profile)
    r = hardware.report()
    if torch.cuda.is_available():
        pytest.fail("profiles simulate CPUs; this test expects the CPU report")
    assert r.profile == profile and r.device_name == cpu_profiles.PROFILES[profile].cpu
    assert (r.precisions["bf16"].accelerated, r.precisions["fp16"].accelerated) == (bf16, fp16)
    assert hardware.cpu_flags() == cpu_profiles.PROFILES[profile].flags
    probe = hardware.measured_probe()
    assert probe is hardware.measured_probe(), "one calibration per profile"
    assert probe.seconds == cpu_profiles.PROFILES[profile].probe_seconds
    # bf16 is measured fast exactly where the flags promise it (fp16 on AMX: 1.1x, not fast)
    assert hardware.is_fast("bf16") == bf16
    assert "NOT this machine's own" in hardware.format_report(r)


def test_without_a_profile_the_report_is_this_machines(monkeypatch):
    monkeypatch.delenv("MPCOURSE_HARDWARE", raising=False)
    r = hardware.report()
    assert r.profile is None and "NOT this machine's own" not in hardware.format_report(r)
    assert hardware.cpu_flags() == hardware.detected_cpu_flags()
    monkeypatch.setenv("MPCOURSE_HARDWARE", "")      # empty counts as unset
    assert hardware.report().profile is None


def test_the_avx2_and_amx_profiles_decide_the_lab_and_the_warning(monkeypatch):
    """The branches lesson 10's bf16 run took on an AVX2 machine, taken here."""
    from mpcourse.train.sizing import lab_size
    from mpcourse.train import (RunConfig, UnacceleratedPrecisionWarning, fit_to_hardware,
                                precision_support)
    monkeypatch.setenv("MPCOURSE_HARDWARE", "avx2")
    assert lab_size("cpu").fast == ()
    with pytest.warns(UnacceleratedPrecisionWarning, match="bf16 on this cpu is not accelerated"):
        precision_support("bf16", "cpu")
    assert fit_to_hardware(RunConfig(precision="bf16", device="cpu")).time_limit_s is not None
    monkeypatch.setenv("MPCOURSE_HARDWARE", "amx")
    assert lab_size("cpu").fast == ("bf16",)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision_support("bf16", "cpu")
    assert fit_to_hardware(RunConfig(precision="bf16", device="cpu")).time_limit_s is None


def test_an_unknown_profile_is_refused_by_name(monkeypatch, capsys):
    monkeypatch.setenv("MPCOURSE_HARDWARE", "avx512")
    with pytest.raises(ValueError, match=r"'avx512' is not a hardware profile; choose one of avx2, "
                                         r"avx512-bf16, amx, arm"):
        hardware.report()
    assert main(["doctor"]) == 2
    assert "is not a hardware profile" in capsys.readouterr().err


def test_simulated_sets_the_profile_for_a_block_and_restores_it(monkeypatch):
    monkeypatch.setenv("MPCOURSE_HARDWARE", "amx")
    with cpu_profiles.simulated("avx2") as profile:
        assert profile.name == "avx2" and hardware.report().profile == "avx2"
        assert not hardware.report().precisions["bf16"].accelerated
    assert hardware.report().profile == "amx"
    monkeypatch.delenv("MPCOURSE_HARDWARE")
    with pytest.raises(RuntimeError), cpu_profiles.simulated("arm"):
        raise RuntimeError("the block fails")
    assert hardware.report().profile is None
    with pytest.raises(ValueError, match="'sse' is not a hardware profile"):
        with cpu_profiles.simulated("sse"):
            pass


def test_gpu_rehearsal_takes_the_gpu_sizes_on_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(hardware.GPU_REHEARSAL_VARIABLE, raising=False)
    assert hardware.scaled(cpu=1, cuda=2) == 1 and not hardware.rehearsing_gpu()
    monkeypatch.setenv(hardware.GPU_REHEARSAL_VARIABLE, "1")
    assert hardware.scaled(cpu=1, cuda=2) == 2 and hardware.rehearsing_gpu()
    monkeypatch.setenv(hardware.GPU_REHEARSAL_VARIABLE, "yes")
    with pytest.raises(ValueError, match="MPCOURSE_GPU_REHEARSAL='yes'"):
        hardware.scaled(cpu=1, cuda=2)
