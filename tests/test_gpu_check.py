"""benchmarks/gpu_check.py's table (speed-ups against fp32 and tf32, MFU per GPU class) from
made-up results, and tools/gpu_check.py's smoke path (`make gpu-check SMOKE=1`) run for real on
this machine, with one tiny notebook under nbval."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from mpcourse.machine import gpus

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = sys.modules["gpu_check"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def _result(precision, tokens_per_s, accelerated=True):
    return SimpleNamespace(config=SimpleNamespace(precision=precision), tokens_per_s=tokens_per_s,
                           peak_memory_bytes=2**30, accelerated=accelerated)


RESULTS = [_result("fp32", 1000.0), _result("tf32", 2000.0), _result("bf16", 5000.0),
           _result("fp16", 4000.0)]


def test_each_row_has_its_speed_ups_against_fp32_and_tf32():
    rows = {r.precision: r for r in gpu_check.rows(RESULTS, None, 10**9)}
    assert (rows["bf16"].vs_fp32, rows["bf16"].vs_tf32) == (5.0, 2.5)
    assert (rows["tf32"].vs_fp32, rows["tf32"].vs_tf32) == (2.0, 1.0)
    assert rows["fp16"].tflops == pytest.approx(4000 * 10**9 / 1e12)


@pytest.mark.parametrize("name", ["B200", "H100 PCIe", "H100 SXM", "RTX PRO 6000 Blackwell", "A100 40GB"])
def test_the_mfu_of_each_row_is_over_its_own_classs_peak_for_its_precision(name):
    gpu, flops = gpus.gpu_class(name), 10**9
    rows = {r.precision: r for r in gpu_check.rows(RESULTS, gpu, flops)}
    for result in RESULTS:
        precision = result.config.precision
        peak = gpu.device.peak_flops[precision]
        assert rows[precision].mfu == pytest.approx(result.tokens_per_s * flops / peak)


def test_a_t4_has_no_tf32_row_and_no_bf16_mfu_and_an_unknown_gpu_no_mfu_at_all():
    t4_rows = gpu_check.rows([_result("fp32", 1000.0), _result("bf16", 900.0, False),
                              _result("fp16", 3000.0)], gpus.gpu_class("T4"), 10**9)
    assert [r.vs_tf32 for r in t4_rows] == [None, None, None]
    assert [r.mfu is None for r in t4_rows] == [False, True, False]
    text = gpu_check.format_rows(t4_rows, "the T4's datasheet lists no bf16 peak")
    assert "MFU n/a: the T4's datasheet lists no bf16 peak" in text and "(not accelerated here)" in text
    assert all(r.mfu is None for r in gpu_check.rows(RESULTS, None, 10**9))


def _tiny_notebook(folder: Path) -> None:
    cell = nbformat.v4.new_code_cell("print(1 + 1)", execution_count=1,
                                     outputs=[nbformat.v4.new_output("stream", name="stdout", text="2\n")])
    folder.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "99_tiny.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "98_not_chosen.ipynb")


def test_the_smoke_run_passes_here_and_writes_a_record_marked_smoke(tmp_path):
    _tiny_notebook(tmp_path / "notebooks")
    command = [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--smoke", "--out", str(tmp_path / "out"),
               "--notebooks", str(tmp_path / "notebooks"), "--lessons", "99"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("SMOKE RUN (tiny sizes, nothing measured)")
    record_file, = (tmp_path / "out").glob("*-smoke.json")
    record = json.loads(record_file.read_text())
    assert record["smoke"] is True and record["torch"] and "cublas" in record
    assert [r["precision"] for r in record["lab"]["rows"]] == ["fp32", "tf32", "bf16", "fp16"]
    assert [(r["notebook"], r["verdict"]) for r in record["lessons"]] == [("99_tiny.ipynb", "passed")]
    assert record["skipped"] == {"98_not_chosen.ipynb": "smoke run: checks the script only"}


def test_without_a_gpu_the_real_check_refuses_in_one_line_and_bad_lessons_are_named():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py")], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr and "SMOKE=1" in done.stderr
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--smoke", "--lessons", "6"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "two-digit lesson numbers (00 to 11), got 6" in done.stderr


@pytest.mark.parametrize("name, capability, expected", [
    ("NVIDIA B200", (10, 0), "B200"), ("NVIDIA H100 NVL", (9, 0), "H100 NVL"), ("NVIDIA L40S", (8, 9), None)])
def test_the_device_is_classed_by_name_and_an_unknown_one_is_named_with_its_capability(
        monkeypatch, name, capability, expected):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    found, gpu, no_mfu = gpu_check._device()
    assert found == name and (gpu.name if gpu else None) == expected
    if expected is None:
        assert no_mfu == "NVIDIA L40S (sm_89) is not in the table of mpcourse.machine.gpus: measured figures only"
