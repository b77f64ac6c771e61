"""MasterWeightOptimizer: FP32 masters behind 16-bit working parameters."""
import copy
import pickle

import pytest
import torch

from mpcourse import GradScaler, MasterWeightOptimizer
from mpcourse.numbers.formats import BF16, FP16, round_to

DTYPES = [torch.float16, torch.bfloat16]


def mlp(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1)).to(dtype)


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)) for _ in range(n)]


def loss_of(model, x, y):
    dtype = next(model.parameters()).dtype
    return (model(x.to(dtype)).float() - y).pow(2).mean()


@pytest.mark.parametrize("dtype", DTYPES)
def test_step_is_the_inner_optimizer_on_fp32_masters_then_rounding(dtype):
    """Reference: torch AdamW on an FP32 copy fed the 16-bit gradients, rounded back each step."""
    model = mlp(dtype)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    masters = [p.detach().float().requires_grad_() for p in model.parameters()]
    reference = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1)
    fmt = FP16 if dtype == torch.float16 else BF16
    for x, y in batches(5):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        for master, p in zip(masters, model.parameters()):
            master.grad = p.grad.float()
        working_before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        reference.step()
        for master, ours, p in zip(masters, opt.master_parameters(), model.parameters()):
            assert torch.equal(master, ours), "masters differ from AdamW on FP32 copies"
            assert p.dtype == dtype and ours.dtype == torch.float32
            assert torch.equal(p.float(), round_to(master.detach(), fmt)), \
                "working copy is not the master rounded to nearest even"
        assert any(not torch.equal(a, b) for a, b in zip(working_before, model.parameters()))
    assert all(v.dtype == torch.float32 for s in opt.state.values() for k, v in s.items()
               if k != "step")


def test_write_back_rounds_ties_to_even():
    w = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    opt = MasterWeightOptimizer([w], torch.optim.SGD, lr=1.0)
    # Step the masters by -g: 1 + 2**-11 is halfway between 1 and 1 + 2**-10 (ties to 1.0, even);
    # 1 + 3 * 2**-11 is halfway between 1 + 2**-10 and 1 + 2**-9 (ties to 1 + 2**-9, even).
    (w * torch.tensor([-2.0**-11, -3 * 2.0**-11, -2.0**-12]).half()).sum().backward()
    opt.step()
    assert opt.master_parameters()[0].tolist() == [1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-12]
    assert w.tolist() == [1.0, 1 + 2**-9, 1.0]


def test_stagnation_pure_fp16_stalls_master_weights_accumulate():
    pure = torch.nn.Parameter(torch.ones((), dtype=torch.float16))
    plain = torch.optim.SGD([pure], lr=1e-4)
    working = torch.nn.Parameter(torch.ones((), dtype=torch.float16))
    opt = MasterWeightOptimizer([working], torch.optim.SGD, lr=1e-4)
    for _ in range(1000):
        for o, p in ((plain, pure), (opt, working)):
            o.zero_grad()
            (-p).backward()  # gradient -1: each step adds lr * 1 = 1e-4
            o.step()
    assert pure.item() == 1.0, "1.0 + 1e-4 rounds back to 1.0 in FP16"
    assert abs(opt.master_parameters()[0].item() - 1.1) < 1e-3
    assert abs(working.item() - 1.1) < 1e-3


def test_fp16_training_with_master_weights_and_scaling_matches_fp32():
    data = batches(150)
    final = {}
    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        model = mlp(dtype)
        if dtype == torch.float32:
            opt, scaler = torch.optim.Adam(model.parameters(), lr=3e-3), GradScaler(enabled=False)
        else:
            opt = MasterWeightOptimizer(model.parameters(), torch.optim.Adam, lr=3e-3)
            scaler = GradScaler(growth_interval=50)
        for x, y in data:
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            scaler.step(opt)
            scaler.update()
        with torch.no_grad():
            final[name] = sum(loss_of(model, x, y).item() for x, y in data[-20:]) / 20
    assert final["fp16"] < 0.95 * loss_of(mlp(torch.float32), *data[0]).item(), "did not train"
    assert abs(final["fp16"] - final["fp32"]) <= 0.02 * final["fp32"], final


def run_with_scaler(make_scaler, steps=12, inject=()):
    model = mlp(torch.float16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    scaler = make_scaler()
    scales = []
    for step, (x, y) in enumerate(batches(steps)):
        opt.zero_grad()
        loss = loss_of(model, x, y) * (float("inf") if step in inject else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(opt.master_parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, [p.detach().clone() for p in opt.master_parameters()]


def test_works_with_our_scaler_and_torchs_bitwise():
    ours = run_with_scaler(lambda: GradScaler(init_scale=2.0**20, growth_interval=3), inject={5})
    theirs = run_with_scaler(lambda: torch.amp.GradScaler("cpu", init_scale=2.0**20,
                                                          growth_interval=3), inject={5})
    assert ours[0] == theirs[0]
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1]))


def test_unscaling_happens_on_fp32_master_gradients():
    model = mlp(torch.float16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    scaler = GradScaler(init_scale=1024.0)
    x, y = batches(1)[0]
    scaler.scale(loss_of(model, x, y)).backward()
    scaled = [p.grad.float() for p in model.parameters()]
    scaler.unscale_(opt)  # would raise "Attempting to unscale FP16 gradients." on the model
    for s, master in zip(scaled, opt.master_parameters()):
        assert master.grad.dtype == torch.float32
        assert torch.equal(master.grad, s * (1 / 1024))
    with pytest.raises(ValueError, match="FP16"):
        scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))


def test_clip_after_unscale_on_masters():
    model = mlp(torch.float16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    scaler = GradScaler(init_scale=2.0**12)
    x, y = batches(1)[0]
    scaler.scale(loss_of(model, x, y)).backward()
    true_grads = [p.grad.float() / 2**12 for p in model.parameters()]
    assert all(torch.isfinite(g).all() for g in true_grads)
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(opt.master_parameters(), 0.01)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in true_grads]))
    assert norm > 0.01, "the test needs gradients large enough to be clipped"
    for g, master in zip(true_grads, opt.master_parameters()):
        torch.testing.assert_close(master.grad, g * (0.01 / norm), rtol=1e-5, atol=0)


def test_skipped_step_leaves_masters_working_and_state_unchanged():
    model = mlp(torch.float16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    scaler = GradScaler()
    for step, (x, y) in enumerate(batches(3)):
        opt.zero_grad()
        loss = loss_of(model, x, y) * (float("nan") if step == 2 else 1.0)
        if step == 2:
            saved = copy.deepcopy(opt.state_dict())
            working = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(working, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(saved["masters"], opt.master_parameters()))
    for index, entry in saved["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, opt.state_dict()["state"][index][key])


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_clears_working_and_master_gradients(set_to_none):
    model = mlp(torch.bfloat16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    loss_of(model, *batches(1)[0]).backward()
    opt.zero_grad(set_to_none=set_to_none)
    for p in list(model.parameters()) + opt.master_parameters():
        assert (p.grad is None) if set_to_none else torch.count_nonzero(p.grad) == 0


def test_state_dict_round_trip_continues_identically():
    data = batches(10)

    def train(model, opt, part):
        for x, y in part:
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()

    model = mlp(torch.bfloat16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    train(model, opt, data[:5])
    checkpoint = {"model": copy.deepcopy(model.state_dict()), "optimizer": opt.state_dict()}
    snapshot = copy.deepcopy(checkpoint["optimizer"])
    train(model, opt, data[5:])

    resumed = mlp(torch.bfloat16, seed=123)
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = MasterWeightOptimizer(resumed.parameters(), torch.optim.AdamW, lr=1e-2)
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    train(resumed, resumed_opt, data[5:])

    assert all(torch.equal(a, b) for a, b in zip(snapshot["masters"],
                                                 checkpoint["optimizer"]["masters"])), \
        "state_dict() should be a snapshot that later steps do not change"
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(opt.master_parameters(), resumed_opt.master_parameters()):
        assert torch.equal(a, b)
    for key, value in opt.state_dict()["state"][0].items():
        assert torch.equal(value, resumed_opt.state_dict()["state"][0][key])


def test_parameter_groups_keep_their_options():
    model = mlp(torch.float16)
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = MasterWeightOptimizer([{"params": weights}, {"params": biases, "lr": 0.5}],
                                torch.optim.SGD, lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert all(p.dtype == torch.float32 for g in opt.param_groups for p in g["params"])


def test_bad_input_gets_clear_errors():
    with pytest.raises(ValueError, match="float32"):
        MasterWeightOptimizer(mlp(torch.float32).parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        MasterWeightOptimizer([], torch.optim.SGD, lr=0.1)
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="twice"):
        MasterWeightOptimizer([p, p], torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="leaf"):
        MasterWeightOptimizer([p * 2], torch.optim.SGD, lr=0.1)
    with pytest.raises(TypeError, match="set"):
        MasterWeightOptimizer([{"params": {p}}], torch.optim.SGD, lr=0.1)
    opt = MasterWeightOptimizer([p], torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="masters"):
        opt.load_state_dict({**opt.state_dict(), "masters": []})
    with pytest.raises(ValueError, match="masters"):
        opt.load_state_dict(opt.optimizer.state_dict())


@pytest.mark.parametrize("inner", [False, True])
def test_lr_scheduler_drives_the_steps(inner):
    """A scheduler takes the optimizer itself (a torch.optim.Optimizer) or the inner one."""
    w = torch.nn.Parameter(torch.zeros((), dtype=torch.float16))
    opt = MasterWeightOptimizer([w], torch.optim.SGD, lr=1.0)
    assert isinstance(opt, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(opt.optimizer if inner else opt, step_size=1,
                                                gamma=0.5)
    for _ in range(3):
        opt.zero_grad()
        (-w).backward()
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.125
    assert w.item() == 1.0 + 0.5 + 0.25


# Drop-in fidelity: a torch optimizer's behaviour, on FP32 masters (issue 17).

class Reference:
    """The mechanism written out by hand: `optimizer_cls` on FP32 copies of a 16-bit model."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.working = list(params)
        self.masters = [w.detach().float().requires_grad_() for w in self.working]
        self.optimizer = optimizer_cls(self.masters, **kwargs)

    def take_gradients(self):
        for w, m in zip(self.working, self.masters):
            m.grad = None if w.grad is None else w.grad.float()

    @torch.no_grad()
    def round_into_working(self):
        for w, m in zip(self.working, self.masters):
            w.copy_(m)

    def step(self):
        self.take_gradients()
        self.optimizer.step()
        self.round_into_working()


def assert_same(ours_working, ours_opt, reference):
    assert len(ours_opt.master_parameters()) == len(reference.masters)
    for a, b in zip(ours_opt.master_parameters(), reference.masters):
        assert torch.equal(a, b), "masters differ from the optimizer run on FP32 copies by hand"
    for a, b in zip(ours_working, reference.working, strict=True):
        assert torch.equal(a, b), "working copies differ from the hand-made reference"


OPTIMIZERS = {
    "SGD": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "SGD-fused": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, fused=True)),
    "Adam": (torch.optim.Adam, dict(lr=1e-2)),
    "Adam-fused": (torch.optim.Adam, dict(lr=1e-2, fused=True)),
    "Adam-for-loop": (torch.optim.Adam, dict(lr=1e-2, foreach=False)),
    "AdamW-amsgrad": (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    "AdamW-fused": (torch.optim.AdamW, dict(lr=1e-2, fused=True)),
    "Adagrad": (torch.optim.Adagrad, dict(lr=0.1)),
    "Adagrad-fused": (torch.optim.Adagrad, dict(lr=0.1, fused=True)),
    "Adadelta": (torch.optim.Adadelta, dict(lr=1.0)),
    "Adafactor": (torch.optim.Adafactor, dict(lr=1e-2)),
    "Adamax": (torch.optim.Adamax, dict(lr=1e-2)),
    "ASGD": (torch.optim.ASGD, dict(lr=1e-2)),
    "NAdam": (torch.optim.NAdam, dict(lr=1e-2)),
    "RAdam": (torch.optim.RAdam, dict(lr=1e-2)),
    "RMSprop": (torch.optim.RMSprop, dict(lr=1e-3, momentum=0.9, centered=True)),
    "Rprop": (torch.optim.Rprop, dict(lr=1e-3)),
    "Muon": (torch.optim.Muon, dict(lr=1e-2)),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_torch_optimizer_runs_on_the_masters_bitwise(name):
    optimizer_cls, kwargs = OPTIMIZERS[name]
    trainable = (lambda m: [p for p in m.parameters() if p.ndim == 2]) if name == "Muon" \
        else (lambda m: list(m.parameters()))  # Muon updates matrices only
    model, twin = mlp(torch.float16), mlp(torch.float16)
    opt = MasterWeightOptimizer(trainable(model), optimizer_cls, **kwargs)
    reference = Reference(trainable(twin), optimizer_cls, **kwargs)
    for x, y in batches(4):
        for m, o in ((model, opt), (twin, reference.optimizer)):
            m.zero_grad()
            loss_of(m, x, y).backward()
        opt.step()
        reference.step()
    assert_same(trainable(model), opt, reference)
    assert not torch.equal(model[0].weight, mlp(torch.float16)[0].weight), "nothing trained"


def test_lbfgs_closure_sees_the_weights_being_tried():
    x, y = batches(1)[0]
    model, twin = mlp(torch.bfloat16), mlp(torch.bfloat16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.LBFGS, lr=0.5, max_iter=6)
    reference = Reference(twin.parameters(), torch.optim.LBFGS, lr=0.5, max_iter=6)
    calls = []

    def closure():
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        calls.append(loss.item())
        return loss

    def reference_closure():
        reference.round_into_working()
        twin.zero_grad()
        loss = loss_of(twin, x, y)
        loss.backward()
        reference.take_gradients()
        return loss

    for _ in range(2):
        first = opt.step(closure)
        assert torch.equal(first, reference.optimizer.step(reference_closure))
        reference.round_into_working()
    assert_same(list(model.parameters()), opt, reference)
    assert len(calls) > 2 and calls[-1] < calls[0], "LBFGS should re-evaluate and improve"


def test_a_gradient_assigned_or_edited_by_hand_is_the_one_used():
    """Gradient surgery on the working parameters: the step uses what .grad holds at step()."""
    model, twin = mlp(torch.float16), mlp(torch.float16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    reference = Reference(twin.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    for step, (x, y) in enumerate(batches(4)):
        for m in (model, twin):
            m.zero_grad()
            loss_of(m, x, y).backward()
            weight, bias = m[0].weight, m[0].bias
            weight.grad.mul_(0.5)                                 # edited in place
            bias.grad = torch.randn(bias.shape, generator=torch.Generator().manual_seed(step)
                                    ).half()                       # replaced
            m[2].bias.grad = None if step % 2 else m[2].bias.grad  # dropped: not stepped
        opt.step()
        reference.step()
        assert_same(list(model.parameters()), opt, reference)
    manual = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    only_by_hand = MasterWeightOptimizer([manual], torch.optim.SGD, lr=1.0)
    manual.grad = torch.randn(4, generator=g).bfloat16()
    only_by_hand.step()
    assert torch.equal(only_by_hand.master_parameters()[0], 1 - manual.grad.float())


def unscale_then_clip_the_working_gradients(scaler):
    model = mlp(torch.float16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    scaler.scale(loss_of(model, *batches(1)[0])).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)  # scaled 16-bit gradients: wrong
    return model, opt


def test_editing_working_gradients_after_unscaling_the_masters_is_an_error():
    model, opt = unscale_then_clip_the_working_gradients(GradScaler())
    before = [m.detach().clone() for m in opt.master_parameters()]
    with pytest.raises(RuntimeError, match="master_parameters"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, opt.master_parameters()))


def test_limit_torchs_unscale_is_invisible_so_the_edited_working_gradient_wins():
    """torch's unscale kernel does not bump the gradients' version counters (documented limit)."""
    scaler = torch.amp.GradScaler("cpu")
    model, opt = unscale_then_clip_the_working_gradients(scaler)
    scaler.step(opt)
    for p, master in zip(model.parameters(), opt.master_parameters()):
        assert torch.equal(master.grad, p.grad.float())


def test_frozen_parameters_are_accepted_and_left_alone():
    model, twin = mlp(torch.float16), mlp(torch.float16)
    for m in (model, twin):
        m[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2,
                                weight_decay=0.5)
    reference = Reference(twin.parameters(), torch.optim.AdamW, lr=1e-2, weight_decay=0.5)
    for x, y in batches(3):
        for m, o in ((model, opt), (twin, reference.optimizer)):
            o.zero_grad()
            m.zero_grad()
            loss_of(m, x, y).backward()
        opt.step()
        reference.step()
    assert torch.equal(model[0].weight, frozen), "a parameter without gradient must not move"
    assert opt.master_parameters()[0].grad is None
    assert_same(list(model.parameters()), opt, reference)


@pytest.mark.parametrize("scaler", [GradScaler, lambda: torch.amp.GradScaler("cpu")])
def test_a_parameter_unfrozen_later_trains_as_if_never_frozen(scaler):
    runs = []
    for freeze in (False, True):
        model = mlp(torch.float16)
        model[0].weight.requires_grad_(not freeze)
        opt = MasterWeightOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
        model[0].weight.requires_grad_(True)
        grad_scaler = scaler()
        for x, y in batches(3):
            opt.zero_grad()
            grad_scaler.scale(loss_of(model, x, y)).backward()
            grad_scaler.step(opt)
            grad_scaler.update()
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_add_param_group_makes_masters_for_the_new_parameters():
    model, twin = mlp(torch.bfloat16), mlp(torch.bfloat16)
    opt = MasterWeightOptimizer(model[0].parameters(), torch.optim.AdamW, lr=1e-2)
    reference = Reference(twin.parameters(), torch.optim.AdamW, lr=1e-2)
    reference.optimizer.param_groups[0]["params"] = reference.masters[:2]
    for step, (x, y) in enumerate(batches(4)):
        if step == 2:
            opt.add_param_group({"params": model[2].parameters(), "lr": 0.05})
            reference.optimizer.add_param_group({"params": reference.masters[2:], "lr": 0.05})
        for m, o in ((model, opt), (twin, reference.optimizer)):
            o.zero_grad()
            m.zero_grad()
            loss_of(m, x, y).backward()
        opt.step()
        reference.step()
    assert [g["lr"] for g in opt.param_groups] == [1e-2, 0.05]
    assert len(opt.master_parameters()) == 4
    assert all(p.dtype == torch.float32 for g in opt.param_groups for p in g["params"])
    assert_same(list(model.parameters()), opt, reference)
    with pytest.raises(ValueError, match="twice"):
        opt.add_param_group({"params": [model[2].bias]})


def test_a_group_added_to_the_inner_optimizer_directly_is_refused():
    model = mlp(torch.float16)
    opt = MasterWeightOptimizer(model[0].parameters(), torch.optim.SGD, lr=0.1)
    opt.optimizer.add_param_group({"params": list(model[2].parameters())})
    loss_of(model, *batches(1)[0]).backward()
    with pytest.raises(ValueError, match="add_param_group"):
        opt.step()


def test_copying_or_pickling_points_to_state_dict():
    opt = MasterWeightOptimizer(mlp(torch.float16).parameters(), torch.optim.SGD, lr=0.1)
    for copy_it in (copy.deepcopy, copy.copy, pickle.dumps):
        with pytest.raises(TypeError, match="state_dict"):
            copy_it(opt)


def test_step_hooks_state_dict_and_named_parameters_work_as_with_any_optimizer():
    model = mlp(torch.float16)
    opt = MasterWeightOptimizer(model.named_parameters(), torch.optim.SGD, lr=0.1)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(("pre", o)))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(("post", o)))
    loss_of(model, *batches(1)[0]).backward()
    opt.step()
    assert seen == [("pre", opt), ("post", opt)]
    state = opt.state_dict()
    reference = torch.optim.SGD(mlp(torch.float32).named_parameters(), lr=0.1).state_dict()
    assert set(state) == set(reference) | {"masters"}
    assert state["param_groups"] == reference["param_groups"]
