"""Memory and time are measured where the work runs, not where a GPU happens to be: `--device cpu`
on a machine with CUDA (mocked here: torch.cuda says a GPU is present, and its allocator counters
read 0, as they do for work that never touched the GPU) reports the CPU's tensor accounting.
And a training step makes the host wait for the device once, at its end."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from mpcourse.memory.measure import measure_peak_memory
from mpcourse.train import LESSON_CPU_CONFIG, loop, train


@pytest.fixture
def idle_cuda(monkeypatch):
    """A CUDA GPU that nothing runs on: present, and every allocator counter at 0."""
    calls = []
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: props.name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, name=name: calls.append(name))
    for name in ("memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None: 0)
    return calls


def _adam_step(layer, optimizer, x):
    layer(x).square().sum().backward()
    optimizer.step()


def test_a_cpu_models_peak_is_the_cpu_accounting_even_with_a_gpu_present(idle_cuda):
    layer = nn.Linear(256, 256)
    optimizer = torch.optim.Adam(layer.parameters())
    x = torch.randn(64, 256)
    peak = measure_peak_memory(lambda: _adam_step(layer, optimizer, x), model=layer, optimizer=optimizer)
    weights = sum(p.nbytes for p in layer.parameters())
    assert peak.device == "cpu" and peak.parts["parameters"] == weights
    adam_state = sum(t.nbytes for state in optimizer.state.values() for t in state.values())
    assert peak.largest["optimizer state"] == adam_state and peak.largest["gradients"] == weights
    assert idle_cuda == [], "the idle GPU is neither synchronized nor reset"


def test_device_cuda_reads_the_allocator_and_no_hint_on_a_gpu_machine_is_refused(idle_cuda):
    assert measure_peak_memory(lambda: None, device="cuda").device == "cuda"
    assert idle_cuda == ["synchronize", "reset_peak_memory_stats", "synchronize"]
    with pytest.raises(ValueError, match="cannot tell where fn runs.*pass device="):
        measure_peak_memory(lambda: None)


def test_the_lab_run_with_device_cpu_on_a_gpu_machine_reports_the_cpu_peak(idle_cuda):
    config = dataclasses.replace(LESSON_CPU_CONFIG, steps=3, device="cpu", eval_batches=1)
    result = train(config)
    assert result.peak_memory_bytes > sum(p.nbytes for p in torch.nn.Linear(32, 32).parameters())
    assert result.memory_measured_by.startswith("tensor accounting on the second step")


def test_a_step_waits_for_the_device_once(monkeypatch):
    waits = []
    monkeypatch.setattr(loop, "synchronize", lambda device=None: waits.append(device))
    config = dataclasses.replace(LESSON_CPU_CONFIG, steps=4, eval_batches=1)
    train(config)
    assert len(waits) == config.steps + 1, "one wait per step, and one before the first"
