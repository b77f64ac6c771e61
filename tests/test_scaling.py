"""mpcourse.GradScaler against torch.amp.GradScaler("cpu"), run side by side."""
import copy
import math
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mpcourse import GradScaler, MasterWeightOptimizer, StaticLossScaler
from mpcourse.amp.scaling import to_fp32, update_scale
from mpcourse.amp.scaling_experiments import clipped_step, resume_experiment, skipped_steps

STEPS = 50


def torch_scaler(**kwargs):
    return torch.amp.GradScaler("cpu", **kwargs)


def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).to(dtype)


def run(make_scaler, *, inject=None, two_optimizers=False, steps=STEPS, dtype=torch.float32,
        clip=None, optimizer=torch.optim.AdamW):
    """Train with a scaler; `inject[step] = (param_index, value)` plants inf/NaN in a gradient.

    Returns the scale after every update, which optimizers stepped at every step, and the params.
    """
    inject = inject or {}
    model = make_model(dtype)
    params = list(model.parameters())
    groups = [params[:2], params[2:]] if two_optimizers else [params]
    optimizers = [optimizer(group, lr=1e-2) for group in groups]
    scaler = make_scaler()
    data = torch.Generator().manual_seed(1)
    scales, stepped = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no collapse warning in a healthy run
        for step in range(steps):
            x = torch.randn(32, 6, generator=data).to(dtype)
            y = torch.randn(32, 3, generator=data)
            for opt in optimizers:
                opt.zero_grad()
            loss = (model(x).float() - y).pow(2).mean()
            scaler.scale(loss).backward()
            if step in inject:
                index, value = inject[step]
                params[index].grad.view(-1)[step % params[index].numel()] = value
            before = [[p.detach().clone() for p in g] for g in groups]
            for opt in optimizers:
                if clip is not None:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], clip)
                scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
            stepped.append([not all(torch.equal(a, b) for a, b in zip(old, g))
                            for old, g in zip(before, groups)])
    return scales, stepped, [p.detach().clone() for p in params]


def assert_same_run(kwargs, **run_kwargs):
    ours = run(lambda: GradScaler(**kwargs), **run_kwargs)
    theirs = run(lambda: torch_scaler(**kwargs), **run_kwargs)
    assert ours[0] == theirs[0], "scale after each update differs from torch"
    assert ours[1] == theirs[1], "skipped steps differ from torch"
    for a, b in zip(ours[2], theirs[2]):
        assert torch.equal(a, b), "parameters are not bitwise identical to torch's"
    return ours


INF, NAN = float("inf"), float("nan")


def test_consecutive_overflows():
    scales, stepped, _ = assert_same_run(
        dict(growth_interval=5), inject={s: (0, INF) for s in (7, 8, 9, 10, 30, 31)})
    assert [s for s in range(STEPS) if not stepped[s][0]] == [7, 8, 9, 10, 30, 31]
    assert scales[10] == scales[6] / 16


def test_overflow_exactly_at_growth_boundary():
    # Updates 0..2 are clean; update 3 would grow the scale, but overflows instead.
    scales, stepped, _ = assert_same_run(dict(growth_interval=4), inject={3: (2, -INF)})
    assert scales[:5] == [2.0**16, 2.0**16, 2.0**16, 2.0**15, 2.0**15]
    assert scales[7] == 2.0**16  # four clean updates after the overflow


def test_nan_in_one_parameter_only():
    _, stepped, _ = assert_same_run(dict(growth_interval=6), inject={4: (3, NAN), 19: (3, NAN)})
    assert not stepped[4][0] and not stepped[19][0]


def test_two_optimizers_share_one_scaler():
    # An overflow in the first optimizer's gradients skips its step only, but lowers the scale.
    scales, stepped, _ = assert_same_run(dict(growth_interval=3), two_optimizers=True,
                                         inject={5: (0, INF), 12: (3, NAN)})
    assert stepped[5] == [False, True] and stepped[12] == [True, False]
    assert scales[5] == scales[4] / 2 and scales[12] == scales[11] / 2


@pytest.mark.parametrize("kwargs", [
    dict(growth_interval=1),
    dict(init_scale=3.0 * 2**10, growth_factor=3.0, backoff_factor=0.25, growth_interval=7),
    dict(init_scale=1000.0, growth_factor=1.5, backoff_factor=0.3, growth_interval=2),
])
def test_custom_growth_settings(kwargs):
    assert_same_run(kwargs, inject={6: (1, INF), 7: (0, NAN), 25: (2, INF)})


def test_bf16_gradients_unscale_bitwise():
    assert_same_run(dict(init_scale=2.0**10, growth_interval=4), dtype=torch.bfloat16,
                    inject={9: (0, INF)}, optimizer=torch.optim.SGD)


def test_clipping_after_unscale_matches_torch():
    assert_same_run(dict(growth_interval=5), clip=0.05, inject={3: (1, INF)})


def test_disabled_scaler_is_plain_training():
    ours = run(lambda: GradScaler(enabled=False), steps=5)
    theirs = run(lambda: torch_scaler(enabled=False), steps=5)
    assert ours[0] == theirs[0] == [1.0] * 5
    assert all(torch.equal(a, b) for a, b in zip(ours[2], theirs[2]))
    assert GradScaler(enabled=False).state_dict() == torch_scaler(enabled=False).state_dict() == {}


def test_natural_fp16_overflow_with_master_weights():
    """An FP16 model whose scaled gradients overflow by themselves, with either scaler."""
    def train(scaler):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 1)).half()
        opt = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.05)
        data = torch.Generator().manual_seed(2)
        scales = []
        for _ in range(12):
            x = torch.randn(16, 6, generator=data).half()
            opt.zero_grad()
            loss = model(x).float().pow(2).mean() * 100
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return scales, [p.detach().clone() for p in model.parameters()]

    ours = train(GradScaler(init_scale=2.0**24, growth_interval=3))
    theirs = train(torch_scaler(init_scale=2.0**24, growth_interval=3))
    assert ours[0] == theirs[0]
    assert ours[0][0] < 2.0**24, "the FP16 gradients should overflow at scale 2**24"
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1]))


def test_sparse_gradients_match_torch():
    def train(scaler):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)
        for step in range(4):
            opt.zero_grad()
            scaler.scale(emb(torch.tensor([1, 3, 3, step])).pow(2).sum()).backward()
            scaler.step(opt)
            scaler.update()
        return emb.weight.detach()

    assert torch.equal(train(GradScaler()), train(torch_scaler()))


def test_scale_matches_torch_for_tensors_and_nested_lists():
    ours, theirs = GradScaler(init_scale=3.5), torch_scaler(init_scale=3.5)
    x = torch.randn(5).half()
    assert torch.equal(ours.scale(x), theirs.scale(x)) and ours.scale(x).dtype == torch.float16
    nested = [x.float(), (x.double(), x)]
    a, b = ours.scale(nested), theirs.scale(nested)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1][0], b[1][0]) and isinstance(a[1], tuple)


def test_update_with_new_scale():
    for new in (123.456, torch.tensor(7.25)):
        ours, theirs = GradScaler(), torch_scaler()
        ours.scale(torch.ones(())), theirs.scale(torch.ones(()))
        ours.update(new), theirs.update(new)
        assert ours.get_scale() == theirs.get_scale()


def test_getters_and_setters_match_torch():
    ours, theirs = GradScaler(init_scale=0.1), torch_scaler(init_scale=0.1)
    assert ours.get_scale() == theirs.get_scale() == 0.1  # before scale(): the Python float
    ours.scale(torch.ones(())), theirs.scale(torch.ones(()))
    assert ours.get_scale() == theirs.get_scale() == to_fp32(0.1)
    for scaler in (ours, theirs):
        scaler.set_growth_factor(4.0)
        scaler.set_backoff_factor(0.125)
        scaler.set_growth_interval(17)
    for getter in ("get_growth_factor", "get_backoff_factor", "get_growth_interval",
                   "is_enabled", "state_dict"):
        assert getattr(ours, getter)() == getattr(theirs, getter)(), getter


def test_state_dict_round_trip_mid_run_continues_identically():
    def train(first_half, second_half):
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = torch.Generator().manual_seed(1)
        scales = []
        scaler = first_half
        for step in range(40):
            if step == 20:
                second_half.load_state_dict(scaler.state_dict())
                scaler = second_half
            x = torch.randn(32, 6, generator=data)
            opt.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            if step in (8, 9, 22):
                model[0].weight.grad[0, 0] = INF
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return scales, [p.detach() for p in model.parameters()]

    unbroken = train(GradScaler(growth_interval=4), GradScaler(growth_interval=4))
    resumed = train(GradScaler(growth_interval=4), GradScaler())
    into_torch = train(GradScaler(growth_interval=4), torch_scaler())
    from_torch = train(torch_scaler(growth_interval=4), GradScaler())
    for other in (resumed, into_torch, from_torch):
        assert other[0] == unbroken[0]
        assert all(torch.equal(a, b) for a, b in zip(other[1], unbroken[1]))
    assert unbroken[0][19] != 2.0**16, "the test should resume from a changed scale"


def test_skipped_step_leaves_params_and_optimizer_state_bitwise_unchanged():
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = GradScaler()
    for step in range(3):
        opt.zero_grad()
        scaler.scale(model(torch.randn(8, 6)).pow(2).mean()).backward()
        if step == 2:
            model[2].bias.grad[1] = NAN
            params = [p.detach().clone() for p in model.parameters()]
            state = copy.deepcopy(opt.state_dict())
        assert scaler.step(opt) is None or step < 2
        scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    after = opt.state_dict()["state"]
    for index, entry in state["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, after[index][key]), key


def test_usage_errors_match_torch():
    for make in (GradScaler, torch_scaler):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = make()
        with pytest.raises((RuntimeError, AssertionError)):
            scaler.update()  # before any scale()
        scaler.scale(model(torch.randn(2, 6)).sum()).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="already been called on this optimizer"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match="after step"):
            scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
            scaler.step(opt)
        with pytest.raises(RuntimeError, match="Closure"):
            scaler.step(opt, closure=lambda: None)
        scaler.update()
        with pytest.raises(RuntimeError, match="empty"):
            scaler.load_state_dict({})


def test_no_gradients_to_check_is_an_error_like_torch():
    for make in (GradScaler, torch_scaler):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = make()
        scaler.scale(torch.ones(()))
        with pytest.raises((RuntimeError, AssertionError), match="No inf checks"):
            scaler.step(opt)  # backward never ran: no gradients
        with pytest.raises((RuntimeError, AssertionError), match="No inf checks"):
            scaler.update()


def test_fp16_gradients_are_refused_like_torch():
    for make in (GradScaler, torch_scaler):
        model = make_model(torch.float16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = make(init_scale=8.0)
        scaler.scale(model(torch.randn(2, 6).half()).float().sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
            scaler.step(opt)
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


@pytest.mark.parametrize("kwargs, bad", [
    (dict(growth_factor=1.0), "growth_factor"), (dict(growth_factor=0.5), "growth_factor"),
    (dict(backoff_factor=1.0), "backoff_factor"), (dict(backoff_factor=0.0), "backoff_factor"),
    (dict(backoff_factor=1.5), "backoff_factor"), (dict(backoff_factor=-0.5), "backoff_factor"),
    (dict(init_scale=0.0), "init_scale"), (dict(init_scale=-1.0), "init_scale"),
    (dict(init_scale=math.inf), "init_scale"), (dict(init_scale="cpu"), "init_scale"),
    (dict(growth_interval=0), "growth_interval"), (dict(growth_interval=2.5), "growth_interval"),
])
def test_bad_arguments_raise_clear_errors(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        GradScaler(**kwargs)


def test_warns_when_the_scale_collapses_because_the_loss_is_not_finite():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(40):
            opt.zero_grad()
            loss = model(torch.randn(4, 6)).sum() * INF  # a broken forward pass
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "not finite" in messages[0]
    assert scaler.get_scale() < 1.0


@settings(max_examples=300, deadline=None)
@given(scale=st.floats(2.0**-149, 2.0**127, width=32), tracker=st.integers(0, 50),
       found_inf=st.booleans(), growth=st.floats(1.0, 1e6, exclude_min=True),
       backoff=st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
       interval=st.integers(1, 50))
def test_update_rule_matches_torch_kernel(scale, tracker, found_inf, growth, backoff, interval):
    tracker = min(tracker, interval - 1)
    t_scale, t_tracker = torch.tensor(scale), torch.tensor(tracker, dtype=torch.int32)
    torch._amp_update_scale_(t_scale, t_tracker, torch.tensor(float(found_inf)), growth, backoff,
                             interval)
    assert update_scale(scale, tracker, found_inf, growth, backoff, interval) == \
        (t_scale.item(), t_tracker.item())


def test_update_rule_pytorch_test_vector():
    # torch's own test: scale 4, growth 2, backoff 0.25, interval 2.
    assert update_scale(4.0, 0, False, 2.0, 0.25, 2) == (4.0, 1)
    assert update_scale(4.0, 1, False, 2.0, 0.25, 2) == (8.0, 0)
    assert update_scale(8.0, 0, True, 2.0, 0.25, 2) == (2.0, 0)


def test_static_scaler_keeps_its_scale_and_skips_overflows():
    ours = run(lambda: StaticLossScaler(1024.0), inject={4: (0, INF), 5: (1, NAN)})
    theirs = run(lambda: torch_scaler(init_scale=1024.0, growth_interval=10**6),
                 steps=4)
    assert ours[0] == [1024.0] * STEPS
    assert [s[0] for s in ours[1][:8]] == [True] * 4 + [False] * 2 + [True] * 2
    reference = run(lambda: StaticLossScaler(1024.0), steps=4)
    assert all(torch.equal(a, b) for a, b in zip(reference[2], theirs[2]))
    with pytest.raises(ValueError, match="fixed"):
        StaticLossScaler(8.0).update(16.0)
    with pytest.raises(ValueError, match="init_scale"):
        StaticLossScaler(0.0)


# Drop-in fidelity (issue 17): what a real program would notice.

def error_of(action):
    """The exception `action()` raises (None if it returns)."""
    try:
        action()
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return error
    return None


def misuse_scenarios(make):
    """Each misuse of the four calls, on a fresh scaler from `make`: name -> the failing call."""
    def fresh(backward=True):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = make()
        if backward:
            scaler.scale(model(torch.randn(2, 6)).sum()).backward()
        return scaler, opt

    def unscaled_twice():
        scaler, opt = fresh()
        scaler.unscale_(opt)
        return lambda: scaler.unscale_(opt)

    def after_step(method):
        scaler, opt = fresh()
        scaler.step(opt)
        return lambda: getattr(scaler, method)(opt)

    def without_gradients(method):
        scaler, opt = fresh(backward=False)
        scaler.scale(torch.ones(()))
        return lambda: getattr(scaler, method)(opt) if method == "step" else scaler.update()

    def before_scale(method):
        scaler, opt = fresh(backward=False)
        return lambda: scaler.update() if method == "update" else getattr(scaler, method)(opt)

    return {
        "update before scale": before_scale("update"),
        "unscale_ before scale": before_scale("unscale_"),
        "step before scale": before_scale("step"),
        "step without gradients": without_gradients("step"),
        "update without step": without_gradients("update"),
        "unscale_ twice": unscaled_twice(),
        "unscale_ after step": after_step("unscale_"),
        "step twice": after_step("step"),
        "step with a closure": (lambda s: lambda: s[0].step(s[1], closure=lambda: None))(fresh()),
    }


def test_misuse_raises_torchs_exception_types():
    ours, theirs = misuse_scenarios(GradScaler), misuse_scenarios(torch_scaler)
    for name in ours:
        mine, torchs = error_of(ours[name]), error_of(theirs[name])
        assert torchs is not None, f"torch accepts {name}?"
        assert type(mine) is type(torchs), f"{name}: ours {mine!r}, torch {torchs!r}"
    assert type(error_of(ours["update before scale"])) is AssertionError


def scaled_once(make):
    scaler = make()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.randn(2, 6)).sum()).backward()
    scaler.step(opt)
    return scaler


@pytest.mark.parametrize("bad", [1e39, 5, True, "2.0", torch.tensor([2.0]),
                                 torch.tensor([2.0, 3.0]), torch.tensor(2.0, requires_grad=True)],
                         ids=repr)
def test_update_refuses_bad_new_scales_as_torch_does(bad):
    mine = error_of(lambda: scaled_once(GradScaler).update(bad))
    torchs = error_of(lambda: scaled_once(torch_scaler).update(bad))
    assert torchs is not None and type(mine) is type(torchs), (mine, torchs)
    named = f"{bad!r}" if not isinstance(bad, torch.Tensor) else f"{tuple(bad.shape)}"
    assert named in str(mine), f"the message should name the bad value: {mine}"


@pytest.mark.parametrize("new", [123.456, 1e-30, 3e38, torch.tensor(7.25), torch.tensor(4),
                                 torch.tensor(0.1, dtype=torch.float64),
                                 torch.tensor(3.0, dtype=torch.float16)], ids=repr)
def test_update_takes_the_new_scales_torch_takes(new):
    ours, theirs = scaled_once(GradScaler), scaled_once(torch_scaler)
    ours.update(new)
    theirs.update(new)
    assert ours.get_scale() == theirs.get_scale()


@pytest.mark.parametrize("bad", [INF, NAN, 0.0, -2.0, torch.tensor(INF)], ids=repr)
def test_update_refuses_a_scale_torch_would_take_but_no_training_can_use(bad):
    """A documented difference: torch sets such a scale; every later step would then fail."""
    assert error_of(lambda: scaled_once(torch_scaler).update(bad)) is None
    with pytest.raises(ValueError, match="positive finite"):
        scaled_once(GradScaler).update(bad)


FUSED = [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("optimizer", FUSED, ids=lambda c: c.__name__)
def test_fused_optimizers_unscale_themselves_bitwise_like_torch(optimizer, dtype):
    """The fused kernels receive grad_scale and found_inf; FP16 parameters are fine there."""
    fused = lambda params, lr: optimizer(params, lr=lr, fused=True)  # noqa: E731
    scales, stepped, _ = assert_same_run(dict(init_scale=2.0**10, growth_interval=4), steps=12,
                                         inject={3: (0, INF), 7: (2, NAN)}, optimizer=fused,
                                         dtype=dtype)
    assert not stepped[3][0] and stepped[4][0] and scales[3] == scales[2] / 2
    if dtype == torch.float32:  # explicit unscale_ first: grad_scale=None, unscaled already
        assert_same_run(dict(init_scale=2.0**10), steps=6, clip=0.5, optimizer=fused,
                        inject={2: (1, INF)})


class RecordingOptimizer(torch.optim.SGD):
    """An optimizer that does the scaler's work (as torch's fused ones), recording what it got."""
    _step_supports_amp_scaling = True

    def __init__(self, params):
        super().__init__(params, lr=0.1)
        self.received = []

    def step(self, closure=None):
        grad_scale = self.grad_scale
        self.received.append((None if grad_scale is None else grad_scale.item(),
                              self.found_inf.item()))


class OldProtocolOptimizer(torch.optim.SGD):
    """The older form of the protocol: `step` takes the scaler itself."""
    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        self.received = grad_scaler


def test_optimizers_that_take_the_scalers_work_get_what_torch_gives():
    def run_protocol(make):
        model = make_model(torch.float16)
        opt = RecordingOptimizer(model.parameters())
        scaler = make(init_scale=2.0**8)
        for step in range(4):
            opt.zero_grad()
            scaler.scale(model(torch.randn(2, 6).half()).float().sum()).backward()
            if step == 1:
                model[0].weight.grad[0, 0] = INF
            if step == 2:
                opt.grad_scale = torch.tensor(3.0)  # a scale the user set: multiplied in
            before = [p.grad.clone() for p in model.parameters()]
            scaler.step(opt)
            assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters())), \
                "the scaler must leave unscaling to the optimizer"
            assert not hasattr(opt, "found_inf")
            scaler.update()
        return opt.received, scaler.get_scale()

    ours, theirs = run_protocol(GradScaler), run_protocol(torch_scaler)
    assert ours == theirs
    received = ours[0]
    assert received[1] == (2.0**8, 1.0) and received[2] == (2.0**7 * 3.0, 0.0)

    for make in (GradScaler, torch_scaler):
        model = make_model()
        opt = OldProtocolOptimizer(model.parameters(), lr=0.1)
        scaler = make()
        scaler.scale(model(torch.randn(2, 6)).sum()).backward()
        with pytest.warns(FutureWarning, match="stop passing itself"):
            scaler.step(opt)
        assert opt.received is scaler


# Ports of PyTorch's own grad-scaling scenarios (test/test_torch.py, `_run_scaling_case`): each
# trains with an inf planted at one iteration, under our scaler and torch's, side by side.

def upstream_case(make_scaler, iteration, steps=8, skip_at=3):
    torch.manual_seed(0)
    models = [make_model(), make_model()]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    scaler = make_scaler(init_scale=128.0, growth_interval=1)
    data = torch.Generator().manual_seed(2)
    for step in range(steps):
        x, y = torch.randn(8, 6, generator=data), torch.randn(8, 3, generator=data)
        iteration(scaler, models, optimizers, x, y, step == skip_at)
        scaler.update()
    return scaler.get_scale(), [p.detach().clone() for m in models for p in m.parameters()]


def penalty_iteration(scaler, models, optimizers, x, y, plant_inf):
    """A gradient penalty: autograd.grad of the scaled loss, unscaled by hand, then backward."""
    model, optimizer = models[0], optimizers[0]
    optimizer.zero_grad()
    loss = (model(x) - y).pow(2).mean()
    scaled_grads = torch.autograd.grad(scaler.scale(loss), list(model.parameters()),
                                       create_graph=True)
    grads = [g / scaler.get_scale() for g in scaled_grads]
    penalty = sum(g.pow(2).sum() for g in grads).sqrt()
    scaler.scale(loss + penalty).backward()
    if plant_inf:
        model[0].weight.grad[0, 0] = INF
    scaler.step(optimizer)


def multiple_iteration(scaler, models, optimizers, x, y, plant_inf):
    """Two models, two losses, two optimizers, one scaler (torch's test_grad_scaling_multiple)."""
    for optimizer in optimizers:
        optimizer.zero_grad()
    out0, out1 = models[0](x), models[1](x)
    loss0 = (out0 - y).pow(2).mean() + 3 * (out1 - y).pow(2).mean()
    loss1 = (out0 + out1 - y).pow(2).mean()
    scaler.scale(loss0).backward(retain_graph=True)
    scaler.scale(loss1).backward()
    if plant_inf:
        models[1][2].weight.grad[0, 0] = INF
    scaler.unscale_(optimizers[0])
    for optimizer in optimizers:
        scaler.step(optimizer)


@pytest.mark.parametrize("iteration", [penalty_iteration, multiple_iteration],
                         ids=["penalty", "multiple"])
def test_upstream_scaling_cases_match_torch(iteration):
    ours = upstream_case(GradScaler, iteration)
    theirs = upstream_case(torch_scaler, iteration)
    assert ours[0] == theirs[0] and ours[0] != 128.0
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1]))


# The experiments lesson 05 and the clinic share (mpcourse.amp.scaling_experiments).

def test_skipped_steps_are_where_the_scale_went_down():
    assert skipped_steps([2.0**15, 2.0**15, 2.0**14, 2.0**15, 2.0**14]) == [0, 2, 4]
    assert skipped_steps([8.0, 16.0], initial_scale=8.0) == []


def _clip_setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(16, 6), 5 * torch.randn(16, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    return model, optimizer, torch.nn.functional.mse_loss(model(x), y)


@pytest.mark.parametrize("make_scaler", [lambda: torch.amp.GradScaler("cpu"), GradScaler])
def test_clipped_step_in_both_orders_against_plain_clipping(make_scaler):
    max_norm = 0.5
    model, optimizer, loss = _clip_setup()  # the FP32 reference, written out
    loss.backward()
    true_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    optimizer.step()
    assert true_norm > max_norm, "the test needs clipping to matter"
    reference = [p.detach().clone() for p in model.parameters()]

    model, optimizer, loss = _clip_setup()
    plain = clipped_step(loss, optimizer, model.parameters(), max_norm)
    assert plain.true_norm == pytest.approx(true_norm, rel=1e-6)
    assert plain.applied_norm == pytest.approx(max_norm, rel=1e-5)
    assert all(torch.equal(p, r) for p, r in zip(model.parameters(), reference))

    model, optimizer, loss = _clip_setup()
    right = clipped_step(loss, optimizer, model.parameters(), max_norm, make_scaler())
    assert right.true_norm == pytest.approx(true_norm, rel=1e-6)
    assert all(torch.equal(p, r) for p, r in zip(model.parameters(), reference)), \
        "scaling by a power of two and back is exact"

    model, optimizer, loss = _clip_setup()
    wrong = clipped_step(loss, optimizer, model.parameters(), max_norm, make_scaler(),
                         unscale_first=False)
    assert wrong.applied_norm == pytest.approx(max_norm / 2.0**16, rel=1e-5)


def _resume_start():
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 4).half()
    optimizer = MasterWeightOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    return model, optimizer, GradScaler(growth_interval=4)


def _resume_train(model, optimizer, scaler, steps):
    scales = []
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 4, generator=g), 30 * torch.randn(8, 4, generator=g)
        optimizer.zero_grad()
        loss = (model(x.half()).float() - y).pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def test_resume_experiment_repeats_the_run_only_with_the_scaler_state():
    runs = resume_experiment(_resume_start, _resume_train, steps=16, stop_at=8)
    full = runs.uninterrupted
    assert len(full.scales) == 16 and full.scales[7] < 2.0**16, "the scale settled below 2**16"
    assert runs.checkpoint["scaler"]["scale"] == full.scales[7]
    assert runs.with_scaler_state.scales == full.scales[8:]
    assert all(torch.equal(p, q) for p, q in
               zip(runs.with_scaler_state.model.parameters(), full.model.parameters()))
    # A fresh scaler restarts at 2**16 and halves once per skipped step back down.
    without = runs.without_scaler_state.scales
    assert len(skipped_steps(without)) >= math.log2(2.0**16 / full.scales[7]) > 0
    assert not all(torch.equal(p, q) for p, q in
                   zip(runs.without_scaler_state.model.parameters(), full.model.parameters()))
    with pytest.raises(ValueError, match="stop_at"):
        resume_experiment(_resume_start, _resume_train, steps=4, stop_at=4)
