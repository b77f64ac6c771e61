"""The bytes-per-parameter ladder: predictions against what the optimizers really hold."""
import pytest
import torch

from mpcourse.kahan import KahanOptimizer
from mpcourse.models import GPT
from mpcourse.optimizer_memory import (LADDER, NO_CURE, RUNGS, LadderRunConfig, measure_rung)
from mpcourse.stochastic import StochasticRoundingOptimizer
from mpcourse.train import train

TINY = dict(d_model=32, n_layers=1, n_heads=2, batch_size=2, seq_len=16, steps=3, warmup_steps=0,
            eval_batches=1)


def test_the_ladder_descends_from_16_bytes():
    assert [r.bytes_per_parameter() for r in LADDER] == [16, 12, 10, 8, 6 + 8 / 256]
    assert NO_CURE.bytes_per_parameter() == RUNGS["stochastic"].bytes_per_parameter()


@pytest.mark.parametrize("key", list(RUNGS))
def test_prediction_agrees_with_the_bytes_measured(key, one_thread):
    config = LadderRunConfig(rung=key, **TINY)
    measured = measure_rung(config)
    params = sum(p.numel() for p in GPT(config.model_config()).parameters())
    predicted = RUNGS[key].bytes_per_parameter() * params
    assert abs(sum(measured.values()) / predicted - 1) < 0.10
    roles = RUNGS[key].bytes_per_role()
    assert measured["weights"] == roles["weights"] * params
    assert measured["gradients"] == roles["gradients"] * params


def test_each_rung_builds_its_optimizer_and_trains_through_the_one_loop(one_thread):
    kinds = {"kahan": KahanOptimizer, "stochastic": StochasticRoundingOptimizer,
             "8bit": StochasticRoundingOptimizer}
    for key, rung in RUNGS.items():
        config = LadderRunConfig(rung=key, **TINY)
        model = config.prepare_model(GPT(config.model_config()))
        assert all(p.dtype == rung.weight_dtype for p in model.parameters())
        optimizer, _ = config.make_optimizer(model)
        assert isinstance(optimizer, kinds.get(key, torch.optim.Optimizer))
        result = train(config)
        assert result.steps_done == 3 and result.config.label == rung.label
        assert result.losses[-1] < result.losses[0] + 0.5


@pytest.mark.parametrize("key", list(RUNGS))
def test_a_resumed_run_continues_bit_for_bit(key, tmp_path, one_thread):
    config = LadderRunConfig(rung=key, **{**TINY, "steps": 6})
    whole = train(config)
    path = tmp_path / "checkpoint.pt"
    train(LadderRunConfig(rung=key, **{**TINY, "steps": 3}), checkpoint_path=path)
    resumed = train(config, checkpoint_path=path, resume=True)
    assert resumed.losses == whole.losses


def test_rejects_switches_a_rung_cannot_honour():
    with pytest.raises(ValueError, match="unknown rung 'int4'"):
        LadderRunConfig(rung="int4")
    with pytest.raises(ValueError, match="precision='fp32'.*'bf16'"):
        LadderRunConfig(rung="kahan", precision="bf16")
    with pytest.raises(ValueError, match="loss_scaling='dynamic'"):
        LadderRunConfig(rung="kahan", loss_scaling="dynamic")
