"""The live-bytes count of a call, on programs whose peak is known by arithmetic."""
import torch

from mpcourse.memory.step_peak import held_tensors, measure_live_peak


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


def _profiler_peak(fn, held_bytes: int) -> int:
    """torch.profiler's count of the same call, an independent reference: every allocation and
    free of the CPU allocator, in time order, above what was held."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    total = top = 0
    for event in events:
        total += event.nbytes()
        top = max(top, total)
    return held_bytes + top


def test_an_int32_index_counts_the_int64_copy_aten_index_makes_of_it():
    book = torch.linspace(0, 1, 256)                             # 1,024 bytes
    index = torch.randint(0, 256, (10_000,), dtype=torch.int32)  # 40,000

    def look_up():
        return book[index].shape                                 # 40,000 out, 80,000 inside

    peak = measure_live_peak(look_up, lambda: [book, index])
    assert peak.peak == 1024 + 40_000 + 40_000 + 80_000 and peak.peak_op == "index.Tensor"
    assert peak.peak == _profiler_peak(look_up, peak.held)
    as_int64 = index.long()
    assert measure_live_peak(lambda: book[as_int64].shape, lambda: [book, as_int64]).transient == 40_000


def test_each_rungs_step_peak_is_the_profilers(one_thread):
    """The optimizer step of the 8-bit rungs (the dynamic code indexes with int32) and of Kahan,
    measured on two identical builds, once by each counter."""
    import math

    from mpcourse.train.models import next_token_loss
    from mpcourse.train.variants.ladder import LadderRunConfig
    from mpcourse.train import build

    def ready(key):
        config = LadderRunConfig(rung=key, d_model=64, n_layers=1, n_heads=4, batch_size=2,
                                 seq_len=16, steps=3, warmup_steps=0, eval_batches=1)
        run = build(config, torch.device("cpu"))
        for step in range(2):
            x, y = run.batches.get(step)
            next_token_loss(run.model(x).float(), y).backward()
            if step == 0:
                run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
        return run

    for key in ("dynamic", "e4m3", "kahan"):
        ours, theirs = ready(key), ready(key)
        peak = measure_live_peak(ours.optimizer.step, lambda: held_tensors(ours.model, ours.optimizer))
        reference = _profiler_peak(theirs.optimizer.step, peak.held)
        assert math.isclose(peak.peak, reference, rel_tol=1e-3), (key, peak, reference)
