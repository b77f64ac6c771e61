"""mpcourse.memory.measure: what autograd saves, storage by storage, and the largest batch."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mpcourse.memory import accounting as memory
from mpcourse.memory.measure import find_largest_batch, measure_peak_memory, measure_saved_activations


def test_autocast_dtype_must_be_16_bit():
    with pytest.raises(ValueError, match="torch.float16 or torch.bfloat16"):
        measure_saved_activations(nn.Linear(2, 2), torch.randn(1, 2), autocast_dtype=torch.float32)


class Square(nn.Module):
    def forward(self, x):
        return x * x  # mul saves x twice: once as self, once as other


def test_a_storage_saved_twice_is_counted_once():
    x = torch.randn(100, requires_grad=True)
    saved = measure_saved_activations(Square(), x)
    assert saved.total == x.nbytes
    assert saved.by("op") == {"mul": x.nbytes}


def test_linear_saves_its_input_and_references_its_weight():
    layer = nn.Linear(64, 32)
    x = torch.randn(8, 64, requires_grad=True)
    saved = measure_saved_activations(layer, x)
    assert saved.activations == x.nbytes
    assert saved.weight_copies == 0
    assert saved.parameters == layer.weight.nbytes  # listed, not counted in total
    assert saved.total == x.nbytes


def test_the_loss_is_measured_with_the_model():
    layer = nn.Linear(16, 10)
    x, targets = torch.randn(8, 16), torch.randint(10, (8,))
    alone = measure_saved_activations(layer, x)
    with_loss = measure_saved_activations(layer, x, autocast_dtype=torch.bfloat16,
                                          loss=lambda logits: F.cross_entropy(logits, targets))
    assert "log_softmax" not in alone.by("op")
    assert with_loss.by("op")["log_softmax"] == 8 * 10 * 4  # computed in FP32 under autocast
    assert with_loss.activations > x.nbytes // 2 + 8 * 10 * 4 + targets.nbytes


def test_buffers_the_model_holds_are_not_counted_as_activations():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))
    x = torch.randn(5, 4, requires_grad=True)
    saved = measure_saved_activations(model, x)
    # linear: its input; batch norm: its input and the saved mean and 1/std of each feature
    assert saved.activations == x.nbytes + 5 * 6 * 4 + 2 * 6 * 4
    assert saved.parameters >= model[0].weight.nbytes


def test_autocast_saves_16_bit_copies_of_input_and_weight():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.LayerNorm(32))
    x = torch.randn(8, 64, requires_grad=True)
    saved = measure_saved_activations(model, x, autocast_dtype=torch.bfloat16)
    assert saved.weight_copies == 64 * 32 * 2
    # bf16: linear's input and weight copy, GELU's input, LayerNorm's input (CPU autocast runs
    # layer_norm in its input's dtype); FP32: LayerNorm's mean and 1/std, one per row
    assert saved.by("dtype") == {"bfloat16": (8 * 64 + 64 * 32 + 8 * 32 + 8 * 32) * 2,
                                 "float32": 2 * 8 * 4}
    assert set(saved.by("op")) == {"addmm", "gelu", "native_layer_norm"}


# --- peak memory on a CPU ------------------------------------------------------------------

def _adam_step(model, optimizer, x):
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)   # the gradients are gone before the call returns


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accounting path")
def test_cpu_peak_sees_gradients_that_zero_grad_frees_before_the_call_returns():
    layer = nn.Linear(256, 256)
    optimizer = torch.optim.Adam(layer.parameters())
    x = torch.randn(1, 256)   # saves 1 kB: the peak is at the step, not at the end of forward
    peak = measure_peak_memory(lambda: _adam_step(layer, optimizer, x), model=layer,
                               optimizer=optimizer)
    n_bytes = layer.weight.nbytes + layer.bias.nbytes
    state = 2 * n_bytes + 2 * 4  # exp_avg and exp_avg_sq, and one FP32 step counter per tensor
    assert layer.weight.grad is None
    # right after optimizer.step(): weights, gradients and the state Adam just created
    assert peak.parts == {"parameters": n_bytes, "gradients": n_bytes, "optimizer state": state,
                          "saved for backward": 0}
    assert peak.peak == 2 * n_bytes + state
    assert peak.largest == {"gradients": n_bytes, "optimizer state": state,
                            "saved for backward": x.nbytes}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accounting path")
def test_cpu_peak_is_the_largest_moment_not_the_sum_of_each_kinds_largest():
    layer = nn.Linear(16, 16)
    optimizer = torch.optim.Adam(layer.parameters())
    _adam_step(layer, optimizer, torch.randn(1, 16))   # Adam's state exists from here on
    x = torch.randn(4096, 16)   # saves 256 kB, far more than the gradients (1 kB)
    peak = measure_peak_memory(lambda: _adam_step(layer, optimizer, x), model=layer,
                               optimizer=optimizer)
    n_bytes = layer.weight.nbytes + layer.bias.nbytes
    # at the end of forward: no gradients yet, everything saved
    assert peak.parts["saved for backward"] == x.nbytes and peak.parts["gradients"] == 0
    assert peak.largest["gradients"] == n_bytes
    assert peak.peak < peak.parts["parameters"] + sum(peak.largest.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accounting path")
def test_cpu_timeline_follows_the_step_and_holds_the_peak():
    layer = nn.Linear(16, 16)
    optimizer = torch.optim.Adam(layer.parameters())
    x = torch.randn(64, 16)
    peak = measure_peak_memory(lambda: _adam_step(layer, optimizer, x), model=layer,
                               optimizer=optimizer)
    n_bytes = layer.weight.nbytes + layer.bias.nbytes
    first, last = peak.timeline[0], peak.timeline[-1]
    assert first == {"parameters": n_bytes, "gradients": 0, "optimizer state": 0,
                     "saved for backward": 0}
    assert last["gradients"] == 0 and last["optimizer state"] > 0   # zero_grad freed them
    assert max(sum(moment.values()) for moment in peak.timeline) == peak.peak
    assert max(moment["saved for backward"] for moment in peak.timeline) == x.nbytes
    assert {m["gradients"] for m in peak.timeline} >= {layer.bias.nbytes, n_bytes}  # one by one


# --- the batch search ----------------------------------------------------------------------

@pytest.mark.parametrize("edge", [1, 2, 3, 37, 64, 1000])
def test_find_largest_batch_bisects_to_the_edge(edge):
    calls = []

    def fits(batch):
        calls.append(batch)
        return batch <= edge

    assert find_largest_batch(fits, limit=512) == min(edge, 512)
    assert len(calls) <= 2 * math.log2(512) + 2
    assert find_largest_batch(lambda b: False) == 0


def test_measurement_lives_only_in_memory_measure():
    for moved in ("measure_peak_memory", "measure_saved_activations", "SavedActivations",
                  "find_largest_batch", "plot_layouts"):
        with pytest.raises(AttributeError, match=f"no attribute '{moved}'"):
            getattr(memory, moved)
