"""FP32 masters kept as optimizer state, against lesson 04's MasterWeightOptimizer."""
import pytest
import torch

from mpcourse.amp.master import MasterWeightOptimizer
from mpcourse.optim.master_layouts import FP32MasterOptimizer


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4)).bfloat16()


def _loss(model, i):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, 16, generator=g).bfloat16()
    return model(x).float().square().mean()


@pytest.mark.parametrize("per_tensor", [False, True])
def test_same_weights_as_lesson_04s_master_weights(per_tensor):
    ours, theirs = _model(), _model()
    ours_opt = FP32MasterOptimizer(ours.parameters(), torch.optim.AdamW, per_tensor=per_tensor,
                                   lr=1e-2)
    theirs_opt = MasterWeightOptimizer(theirs.parameters(), torch.optim.AdamW, lr=1e-2)
    for i in range(5):
        for model, opt in ((ours, ours_opt), (theirs, theirs_opt)):
            _loss(model, i).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(ours_opt.master_parameters(), theirs_opt.master_parameters()):
        assert torch.equal(a, b) and a.dtype == torch.float32


def test_fp32_gradients_accumulate_micro_batches_in_fp32_and_free_the_bf16_ones():
    model = _model()
    optimizer = FP32MasterOptimizer(model.parameters(), torch.optim.SGD, fp32_gradients=True, lr=0.1)
    reference = _model()
    expected = [torch.zeros(p.shape) for p in reference.parameters()]
    for i in range(4):
        _loss(model, i).backward()
        reference.zero_grad()
        _loss(reference, i).backward()
        for e, p in zip(expected, reference.parameters()):
            e += p.grad.float()
        assert all(p.grad is None for p in model.parameters())
    for master, e in zip(optimizer.master_parameters(), expected):
        assert torch.equal(master.grad, e)
    before = [m.detach().clone() for m in optimizer.master_parameters()]
    optimizer.step()
    for master, old, e, p in zip(optimizer.master_parameters(), before, expected, model.parameters()):
        assert torch.allclose(master.detach(), old - 0.1 * e, rtol=0, atol=1e-7)  # FP32 rounding
        assert torch.equal(p.detach(), master.detach().bfloat16())
    optimizer.zero_grad()
    assert all(m.grad is None for m in optimizer.master_parameters())


def test_rejects_fp32_weights():
    with pytest.raises(ValueError, match="16-bit weights.*got torch.float32"):
        FP32MasterOptimizer([torch.nn.Parameter(torch.ones(2))], torch.optim.SGD, lr=0.1)
