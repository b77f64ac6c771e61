"""DDP with and without 16-bit compression hooks and FSDP2 with a bf16 policy, on 2 local processes.

All runs share one torchrun launch (starting processes costs more than the runs), bounded in
time; each is compared with single-process training on the same global batch.
"""
import dataclasses
import functools
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import to_hex

from mpcourse.distributed import (DistributedRun, DistributedRunConfig, check_nproc, collective_results,
                                  compress_hook, launch, memory_per_rank, run_for_precision, sharding_policy,
                                  simulated_reduce, torchrun_command, wire_bytes)
from mpcourse.train.models import GPT
from mpcourse.train import RunConfig, train
from mpcourse.views.diagrams import DTYPE_COLOURS
from mpcourse.views.distributed import collectives_picture, format_results, plot_wire_bytes

CONFIG = RunConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=8, steps=10,
                   vocab_size=64, lr=1e-2, device="cpu", loss_scaling="off", grad_clip=None)
RUNS = {"ddp": DistributedRun("ddp"), "ddp_fp16": DistributedRun("ddp", "fp16"),
        "ddp_bf16": DistributedRun("ddp", "bf16"),
        "fsdp2": DistributedRun("fsdp2", param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
# How far each run's per-step loss may drift from single-process FP32 training, in nats. The
# FP32 all-reduce only reorders sums; the hooks round gradients to 16 bits (fp16 keeps 11
# significant bits, bf16 8); FSDP2's bf16 policy also computes the forward and backward in bf16.
TOLERANCE = {"ddp": 1e-5, "ddp_fp16": 5e-4, "ddp_bf16": 5e-3, "fsdp2": 3e-2}
LAUNCH_MARGIN = 30  # a launch may take this many times what starting its processes takes now


@functools.lru_cache(maxsize=None)
def launch_backstop(nproc: int = 2) -> float:
    """Wall-clock seconds after which a launch is surely stuck, derived from this machine as it
    is now (never a fixed number a busy machine could outrun): what starting one Python with
    torch.distributed takes here, for torchrun and each process, times LAUNCH_MARGIN."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch.distributed"], check=True)
    return (time.perf_counter() - start) * (nproc + 1) * LAUNCH_MARGIN


@pytest.fixture(scope="module")
def results():
    measured = launch(list(RUNS.values()), CONFIG, nproc=2, timeout_s=launch_backstop() * len(RUNS))
    return dict(zip(RUNS, measured))


@pytest.fixture(scope="module")
def single_process():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(CONFIG).losses
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def num_parameters():
    return GPT(CONFIG.model_config()).num_parameters()


@pytest.mark.parametrize("name", RUNS)
def test_loss_matches_single_process_training(results, single_process, name):
    run = results[name]
    assert run.world_size == 2 and run.backend == "gloo"
    assert len(run.losses) == CONFIG.steps
    drift = max(abs(a - b) for a, b in zip(run.losses, single_process))
    assert drift <= TOLERANCE[name], f"{run.run.label}: per-step losses drift {drift:.2e} from one process"
    assert run.losses[-1] < run.losses[0] - 0.3, "the run should train"


def test_compression_hooks_really_round_the_gradients(results):
    fp32 = results["ddp"].losses
    for name in ("ddp_fp16", "ddp_bf16"):
        assert results[name].losses != fp32, f"{name}: 16-bit gradients must change some loss"
    assert max(abs(a - b) for a, b in zip(results["ddp_fp16"].losses, fp32)) < \
        max(abs(a - b) for a, b in zip(results["ddp_bf16"].losses, fp32)), "fp16 keeps more bits than bf16"


def test_16_bit_hooks_send_exactly_half_the_gradient_bytes(results, num_parameters):
    fp32_bytes = results["ddp"].gradient_bytes_per_step
    assert fp32_bytes == 4 * num_parameters, "DDP all-reduces every FP32 gradient once per step"
    for name in ("ddp_fp16", "ddp_bf16"):
        assert results[name].bytes_per_step == {"all_reduce": fp32_bytes // 2}
        assert 2 * results[name].gradient_bytes_per_step == fp32_bytes


def test_ddp_holds_a_full_fp32_replica_per_rank(results, num_parameters):
    for name in ("ddp", "ddp_fp16", "ddp_bf16"):
        assert results[name].param_bytes == [4 * num_parameters] * 2
        assert results[name].grad_bytes == [4 * num_parameters] * 2


def test_fsdp2_shards_fp32_parameters_and_gathers_bf16(results, num_parameters):
    fsdp = results["fsdp2"]
    # the sharded parameters stay FP32 (they are the master weights), half on each rank
    assert sum(fsdp.param_bytes) == 4 * num_parameters and max(fsdp.param_bytes) < 0.6 * 4 * num_parameters
    assert sum(fsdp.grad_bytes) == 4 * num_parameters
    # the gradients are reduce-scattered in reduce_dtype=float32: all of them, 4 bytes each
    assert fsdp.bytes_per_step["reduce_scatter"] == 4 * num_parameters
    # the all-gathered copy is bf16, and only one block (the biggest unit) is whole at a time
    block = GPT(CONFIG.model_config()).blocks[0]
    assert fsdp.largest_gathered_bytes == 2 * sum(p.numel() for p in block.parameters())
    assert fsdp.bytes_per_step["all_gather"] % 2 == 0


def test_memory_model_matches_what_the_ranks_measured(results, num_parameters):
    block = sum(p.numel() for p in GPT(CONFIG.model_config()).blocks[0].parameters())
    ddp = memory_per_rank("ddp", num_parameters, 2)
    assert results["ddp"].param_bytes == [ddp.parameters] * 2 and results["ddp"].grad_bytes == [ddp.gradients] * 2
    fsdp = memory_per_rank("fsdp2", num_parameters, 2, largest_unit=block,
                           param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert max(results["fsdp2"].param_bytes) == fsdp.parameters
    assert max(results["fsdp2"].grad_bytes) == fsdp.gradients
    assert results["fsdp2"].largest_gathered_bytes == fsdp.gathered
    assert fsdp.optimizer == 2 * fsdp.parameters and fsdp.reduce_buffer == 4 * block
    assert fsdp.peak == fsdp.persistent + 2 * block + 4 * block
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        memory_per_rank("fsdp2", 10, 0)
    with pytest.raises(ValueError, match="unsupported param_dtype"):
        memory_per_rank("fsdp2", 10, 2, param_dtype=torch.int8)


def test_wire_bytes_measured_are_the_ring_formulas(results, num_parameters):
    """What the real runs handed to their collectives, turned into bytes on the wire, is what
    `wire_bytes` predicts: DDP all-reduces every gradient (in 16 bits under a hook); FSDP2
    gathers each block twice (resharded after forward) but the root unit once (FSDP2 keeps the
    root's parameters after forward), and reduce-scatters every gradient once."""
    assert results["ddp"].wire_bytes_per_step == wire_bytes("ddp", num_parameters, 2)
    for name in ("ddp_fp16", "ddp_bf16"):
        assert results[name].wire_bytes_per_step == wire_bytes("ddp", num_parameters, 2,
                                                                reduce_dtype=torch.bfloat16)
    model = GPT(CONFIG.model_config())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    root = num_parameters - CONFIG.n_layers * block
    blocks = wire_bytes("fsdp2", block, 2)
    kept = wire_bytes("fsdp2", root, 2, reshard_after_forward=False)
    measured = results["fsdp2"].wire_bytes_per_step
    assert measured["all_gather"] == CONFIG.n_layers * (blocks["all_gather_forward"] + blocks["all_gather_backward"]) \
        + kept["all_gather_forward"] + kept["all_gather_backward"]
    assert measured["reduce_scatter"] == CONFIG.n_layers * blocks["reduce_scatter"] + kept["reduce_scatter"]
    # per resharded unit FSDP2 sends what DDP sends; the root, kept after forward, 3/4 of it
    assert sum(blocks.values()) == wire_bytes("ddp", block, 2)["all_reduce"]
    assert 4 * sum(kept.values()) == 3 * wire_bytes("ddp", root, 2)["all_reduce"]


def test_plot_wire_bytes_stacks_each_runs_collectives(results):
    fig = plot_wire_bytes(results)
    bars = {kind: [p.get_height() for p in fig.axes[0].patches if p.get_gid() == kind]
            for kind in ("all_reduce", "all_gather", "reduce_scatter")}
    for i, result in enumerate(results.values()):
        for kind, heights in bars.items():
            assert heights[i] == pytest.approx(result.wire_bytes_per_step.get(kind, 0) / 1e3)
    # each part is filled with the dtype it carried: hooks' 16 bits, FSDP2's bf16 gathers, fp32 reduction
    fill = {kind: [to_hex(p.get_facecolor()) for p in fig.axes[0].patches if p.get_gid() == kind]
            for kind in bars}
    order = list(results)
    assert fill["all_reduce"][order.index("ddp")] == DTYPE_COLOURS["fp32"].lower()
    assert fill["all_reduce"][order.index("ddp_fp16")] == DTYPE_COLOURS["fp16"].lower()
    assert fill["all_reduce"][order.index("ddp_bf16")] == DTYPE_COLOURS["bf16"].lower()
    assert fill["all_gather"][order.index("fsdp2")] == DTYPE_COLOURS["bf16"].lower()
    assert fill["reduce_scatter"][order.index("fsdp2")] == DTYPE_COLOURS["fp32"].lower()
    plt.close(fig)


@pytest.mark.parametrize("world_size", [2, 4])
def test_collective_results_are_what_each_collective_computes(world_size):
    inputs = [torch.arange(8.0) * 10 ** r for r in range(world_size)]
    got = collective_results(inputs)
    total = torch.stack(inputs).sum(0)
    assert all(torch.equal(t, total) for t in got["all_reduce"])
    assert all(torch.equal(t, torch.cat(inputs)) for t in got["all_gather"])
    assert all(torch.equal(t, part) for t, part in zip(got["reduce_scatter"], total.chunk(world_size)))
    fig = collectives_picture(inputs, got)
    shown = [t.get_text() for t in fig.axes[0].texts]
    assert shown.count(f"{total[0].item():g}") >= world_size + 1   # every all-reduce row, reduce-scatter rank 0
    plt.close(fig)
    with pytest.raises(ValueError, match="length divisible by the 3 ranks"):
        collective_results([torch.ones(4)] * 3)
    with pytest.raises(ValueError, match="two or more 1-D tensors"):
        collective_results([torch.ones(4)])


def test_simulated_reduce_is_the_hooks_arithmetic():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(1000, generator=g) * 1e-3 for _ in range(8)]
    expected = torch.zeros(1000, dtype=torch.bfloat16)
    for grad in grads:   # what the compress hook and a ring all-reduce do, written out
        expected = expected + grad.to(torch.bfloat16).div_(8)
    assert torch.equal(simulated_reduce(grads, torch.bfloat16), expected.float())
    exact = torch.stack(grads).double().mean(0)
    error = lambda dtype: ((simulated_reduce(grads, dtype).double() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert error(torch.float32) < 1e-6 < error(torch.float16) < error(torch.bfloat16) < 0.01


def test_nproc_beyond_the_machine_is_refused():
    with pytest.raises(ValueError, match="more processes than this machine has CPUs"):
        check_nproc(10_000, "cpu")
    with pytest.raises(ValueError, match="positive integer"):
        check_nproc(0, "cpu")
    with pytest.raises(ValueError, match="CPUs"):
        launch([RUNS["ddp"]], CONFIG, nproc=10_000)


def test_bad_policies_and_runs_are_refused():
    with pytest.raises(ValueError, match="unsupported param_dtype torch.float8_e4m3fn"):
        sharding_policy(torch.float8_e4m3fn, torch.float32)
    with pytest.raises(ValueError, match="unsupported reduce_dtype torch.int32"):
        DistributedRun("fsdp2", param_dtype=torch.bfloat16, reduce_dtype=torch.int32)
    with pytest.raises(ValueError, match="unknown strategy"):
        DistributedRun("zero3")
    with pytest.raises(ValueError, match="compress hooks belong to DDP"):
        DistributedRun("fsdp2", compress="fp16")
    with pytest.raises(ValueError, match="unknown compress"):
        compress_hook("int8")
    with pytest.raises(ValueError, match="split evenly"):
        launch([RUNS["ddp"]], RunConfig(batch_size=7, device="cpu"), nproc=2)


def test_policy_is_torchs_mixed_precision_policy():
    from torch.distributed.fsdp import MixedPrecisionPolicy
    assert sharding_policy(torch.bfloat16, torch.float32) == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def test_a_launch_that_runs_too_long_is_killed():
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        launch([RUNS["ddp"]], CONFIG, nproc=2, timeout_s=0.5)


def test_torchrun_command_starts_this_module():
    command = torchrun_command(2, ["--spec", "s.json"])
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=2" in command
    assert command[-4:] == ["-m", "mpcourse.distributed.worker", "--spec", "s.json"]


def test_precision_maps_to_a_distributed_run_and_results_print(results):
    assert run_for_precision("fp32") == DistributedRun("ddp")
    assert run_for_precision("bf16") == RUNS["fsdp2"]
    assert run_for_precision("fp16").param_dtype == torch.float16
    with pytest.raises(ValueError, match="unknown precision"):
        run_for_precision("fp8")
    table = format_results(list(results.values()))
    assert "DDP fp16 compress hook" in table and f"{results['ddp'].gradient_bytes_per_step:,}" in table


def test_cli_refuses_bad_nproc_with_a_clear_error(capsys):
    from mpcourse.cli import main
    assert main(["train", "--nproc", "10000", "--device", "cpu"]) == 2
    assert "nproc=10000 is more processes than this machine has CPUs" in capsys.readouterr().err
    assert main(["train", "--nproc", "2", "--device", "cpu", "--resume"]) == 2
    assert "--resume works for single-process runs only" in capsys.readouterr().err


@pytest.mark.parametrize("switch,value,strategy", [
    ("time_limit_s", 5.0, "ddp"), ("master_weights", True, "ddp"), ("autocast", "mpcourse", "ddp"),
    ("precision", "bf16", "fsdp2"), ("loss_scaling", "dynamic", "fsdp2")])
def test_a_switch_a_multi_process_run_cannot_honour_is_refused_by_name(switch, value, strategy):
    run = RUNS["ddp"] if strategy == "ddp" else RUNS["fsdp2"]
    config = dataclasses.replace(CONFIG, **{switch: value})
    with pytest.raises(ValueError, match=f"{switch}=.*not supported by a {run.label.split()[0]}"):
        DistributedRunConfig(**dataclasses.asdict(config), run=run)
    with pytest.raises(ValueError, match=switch):   # before any process starts
        launch([run], config, nproc=2, timeout_s=1)


def test_ddp_runs_the_whole_recipe_of_the_one_loop_autocast_scaling_and_clipping():
    """DDP honours every switch of the single-process recipe: bf16 autocast, dynamic loss
    scaling and gradient clipping give the losses of one process on the whole batch."""
    config = dataclasses.replace(CONFIG, precision="bf16", loss_scaling="dynamic", grad_clip=0.05,
                                 steps=8)
    (distributed,) = launch([RUNS["ddp"]], config, nproc=2, timeout_s=launch_backstop())
    alone = train(config).losses
    unclipped = train(dataclasses.replace(config, grad_clip=None)).losses
    assert len(distributed.losses) == config.steps
    # bf16 matmuls over half the rows per process round differently: within bf16's error, and
    # much nearer the clipped single-process run than clipping is to not clipping
    near = max(abs(a - b) for a, b in zip(distributed.losses, alone))
    far = max(abs(a - b) for a, b in zip(alone, unclipped))
    assert near < 5e-3 and near < far / 4, (near, far)


def test_cli_trains_bf16_on_two_processes_with_fsdp2(capsys):
    from mpcourse.cli import main
    assert main(["train", "--nproc", "2", "--device", "cpu", "--precision", "bf16", "--steps", "3",
                 "--d-model", "32", "--layers", "1", "--heads", "2", "--batch", "4",
                 "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    assert "FSDP2 param bfloat16, reduce float32" in out


def test_each_run_names_the_dtype_its_gradients_travel_in():
    assert [RUNS[name].gradient_dtype for name in ("ddp", "ddp_fp16", "ddp_bf16", "fsdp2")] == \
        [torch.float32, torch.float16, torch.bfloat16, torch.float32]
    assert DistributedRun("fsdp2", reduce_dtype=torch.bfloat16).gradient_dtype == torch.bfloat16
