"""The live-bytes count of a call, on programs whose peak is known by arithmetic."""
import torch

from mpcourse.step_memory import held_tensors, measure_live_peak


def test_peak_is_inputs_and_output_of_the_largest_moment():
    held = torch.zeros(1000)                    # 4,000 bytes

    def program():
        a = torch.ones(500)                     # 2,000
        b = a * 2                               # a and b: 4,000
        del a
        c = b + 1                               # b and c: 4,000
        d = torch.cat([b, c])                   # b, c and d: 8,000
        return d.shape

    peak = measure_live_peak(program, lambda: [held])
    assert peak.held == 4000 and peak.peak == 4000 + 8000 and peak.peak_op == "cat.default"
    assert peak.end == 4000 and peak.transient == 8000


def test_views_share_their_storage_and_freed_storages_are_forgotten():
    def program():
        x = torch.ones(1000)
        for _ in range(50):
            x = (x * 2)[::1].view(10, 100).reshape(-1)  # views: no new storage
        return x

    # at each multiplication: the old x and the new product, never the 50 freed ones
    assert measure_live_peak(program).peak == 8000


def test_a_held_tensor_freed_during_the_call_stops_counting():
    weight = torch.nn.Parameter(torch.zeros(1000))
    weight.grad = torch.ones(1000)

    def program():
        weight.grad = None
        torch.ones(250) + 1

    model = torch.nn.Linear(1, 1, bias=False)
    peak = measure_live_peak(program, lambda: held_tensors(model, _NoState()) + [weight, weight.grad])
    assert peak.held == 4 + 8000 and peak.peak == peak.held  # 4,000 + 2 x 1,000 <= 8,000
    assert peak.end == 4 + 4000


class _NoState:
    state: dict = {}
