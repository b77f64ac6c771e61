"""The bytes-per-parameter ladder: predictions against the bytes kept and the step's measured peak."""
import pytest
import torch

from mpcourse.distributed.costs import memory_per_rank
from mpcourse.optim.kahan import KahanOptimizer
from mpcourse.train.variants.ladder_measure import measure_rung
from mpcourse.optim.master_layouts import FP32MasterOptimizer
from mpcourse.train.models import GPT
from mpcourse.optim.optim_states import AdamW
from mpcourse.train.variants.ladder import LADDER, NO_CURE, RUNGS, LadderRunConfig
from mpcourse.optim.stochastic import StochasticRoundingOptimizer
from mpcourse.train import train

TINY = dict(d_model=32, n_layers=1, n_heads=2, batch_size=2, seq_len=16, steps=3, warmup_steps=0,
            eval_batches=1)
WIDE = dict(TINY, d_model=64, n_layers=2, n_heads=4)  # the largest tensor is 4,096 x 4 values


def _sizes(config):
    return [p.numel() for p in GPT(config.model_config()).parameters()]


def test_the_ladder_descends_from_16_bytes_where_every_tensor_is_quantized():
    sizes = [2**20] * 3  # large tensors: every moment is quantized, every scale is shared
    got = {rung.key: rung.bytes_per_parameter(sizes) for rung in LADDER}
    assert got == {"fp32": 16, "master": 16, "master_fp32_grads": 18, "bf16_moments": 12,
                   "kahan": 10, "stochastic": 8, "e4m3": 6 + 8 / 256, "dynamic": 6 + 8 / 256,
                   "e5m2": 6 + 8 / 256}
    assert NO_CURE.bytes_per_parameter(sizes) == 8


def test_small_tensors_keep_bf16_moments_as_in_torchao():
    rung = RUNGS["dynamic"]
    assert rung.moment_bytes(4095) == 4 * 4095 and rung.moment_bytes(4096 + 128) == 4 * 4224
    assert rung.moment_bytes(4096) == 2 * (4096 + 4 * 16)


@pytest.mark.parametrize("sizes", [TINY, WIDE])
@pytest.mark.parametrize("key", list(RUNGS))
def test_kept_bytes_and_step_peak_agree_with_the_prediction(key, sizes, one_thread):
    config = LadderRunConfig(rung=key, **sizes)
    rung, params = RUNGS[key], _sizes(config)
    roles = rung.bytes_per_role(params)
    for per_tensor in (False, True):
        measured = measure_rung(config, per_tensor=per_tensor)
        assert measured.parameters == sum(params)
        for role in ("weights", "gradients", "masters", "compensation"):
            assert measured.kept[role] == roles[role], role
        # the moments also hold a step counter (4 bytes) per tensor
        assert 0 <= measured.kept["moments"] - roles["moments"] <= 4 * len(params)
        predicted = rung.step_peak(params, per_tensor)
        assert abs(measured.step.peak / predicted - 1) < 0.02, (per_tensor, measured.step)
        assert measured.step.end == measured.step.held  # nothing left behind


@pytest.mark.parametrize("key", [k for k, r in RUNGS.items() if r.copies_weights])
def test_stepping_one_tensor_at_a_time_bounds_the_copies_by_the_largest_tensor(key, one_thread):
    config = LadderRunConfig(rung=key, **WIDE)
    params = _sizes(config)
    at_once = measure_rung(config, per_tensor=False).step.peak
    one_by_one = measure_rung(config, per_tensor=True).step.peak
    assert at_once - one_by_one == pytest.approx(8 * (sum(params) - max(params)), abs=64)


def test_each_rung_builds_its_optimizer_and_trains_through_the_one_loop(one_thread):
    kinds = {"fp32": AdamW, "nearest": AdamW, "bf16_moments": AdamW,
             "master": FP32MasterOptimizer, "master_fp32_grads": FP32MasterOptimizer,
             "kahan": KahanOptimizer}
    for key, rung in RUNGS.items():
        config = LadderRunConfig(rung=key, **TINY)
        model = config.prepare_model(GPT(config.model_config()))
        assert all(p.dtype == rung.weight_dtype for p in model.parameters())
        optimizer, _ = config.make_optimizer(model)
        assert type(optimizer) is kinds.get(key, StochasticRoundingOptimizer)
        result = train(config)
        assert result.steps_done == 3 and result.config.label == rung.label
        assert result.losses[-1] < result.losses[0] + 0.5


@pytest.mark.parametrize("key", ["kahan", "stochastic", "master", "master_fp32_grads"])
def test_one_tensor_at_a_time_trains_bit_for_bit_like_all_at_once(key, one_thread):
    runs = [train(LadderRunConfig(rung=key, per_tensor=p, **TINY)) for p in (False, True)]
    assert runs[0].losses == runs[1].losses and runs[0].eval_loss == runs[1].eval_loss


@pytest.mark.parametrize("key", list(RUNGS))
def test_a_resumed_run_continues_bit_for_bit(key, tmp_path, one_thread):
    config = LadderRunConfig(rung=key, **{**TINY, "steps": 6})
    whole = train(config)
    path = tmp_path / "checkpoint.pt"
    train(LadderRunConfig(rung=key, **{**TINY, "steps": 3}), checkpoint_path=path)
    resumed = train(config, checkpoint_path=path, resume=True)
    assert resumed.losses == whole.losses


@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_sharding_uses_lesson_08s_accounting(world_size):
    sizes = [1000, 24, 7]  # 1,031 values: the last shard is padded
    fp32 = RUNGS["fp32"].bytes_per_rank(sizes, world_size)
    assert fp32["ddp"] == memory_per_rank("ddp", 1031, world_size).persistent
    assert fp32["fsdp"] == memory_per_rank("fsdp2", 1031, world_size).persistent
    shard = -(-1031 // world_size)
    master = RUNGS["master"].bytes_per_rank(sizes, world_size)
    assert master["zero1"] == pytest.approx((2 + 2) * 1031 + 12 * shard)  # ZeRO's 2 + 2 + K/W
    assert master["fsdp"] == pytest.approx(16 * shard)


def test_rejects_switches_a_rung_cannot_honour():
    with pytest.raises(ValueError, match="unknown rung 'int4'"):
        LadderRunConfig(rung="int4")
    with pytest.raises(ValueError, match="precision='fp32'.*'bf16'"):
        LadderRunConfig(rung="kahan", precision="bf16")
    with pytest.raises(ValueError, match="loss_scaling='dynamic'"):
        LadderRunConfig(rung="kahan", loss_scaling="dynamic")


def _t_quantile_by_integration(df: int, p: float = 0.975) -> float:
    """Student's t quantile, independently: bisect the CDF, integrated from the density
    (Simpson's rule in float64 on a fine grid)."""
    import math
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t):
        x = torch.linspace(0, t, 20_001, dtype=torch.float64)
        density = torch.exp(log_norm - (df + 1) / 2 * torch.log1p(x * x / df))
        h = t / 20_000
        return 0.5 + h / 3 * (density[0] + density[-1] + 4 * density[1:-1:2].sum()
                              + 2 * density[2:-1:2].sum()).item()

    low, high = 0.0, 50.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return low


@pytest.mark.parametrize("df", range(1, 11))
def test_seed_interval_uses_students_t(df):
    from mpcourse.train.variants.ladder_measure import T_975
    assert T_975[df - 1] == pytest.approx(_t_quantile_by_integration(df), abs=6e-4)


def test_seed_interval_estimates_the_spread_from_the_seeds():
    import statistics
    from mpcourse.train.variants.ladder_measure import seed_interval
    values = [0.010, -0.002, 0.004, 0.008]
    got = seed_interval(values)
    half = 3.182 * statistics.stdev(values) / 2
    assert got.mean == pytest.approx(0.005) and got.spread == pytest.approx(statistics.stdev(values))
    assert (got.low, got.high) == pytest.approx((0.005 - half, 0.005 + half)) and got.seeds == 4
    for bad in ([1.0], [0.0] * 12):
        with pytest.raises(ValueError, match="2 to 11 values"):
            seed_interval(bad)
