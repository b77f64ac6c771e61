"""The pictures claim what torch and mpcourse really computed (mpcourse.views diagrams)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from torch import nn  # noqa: E402

import mpcourse  # noqa: E402
from mpcourse.distributed import wire_bytes, wire_bytes_of_payload  # noqa: E402
from mpcourse.lowbit.fp8 import Fp8Linear  # noqa: E402
from mpcourse.amp.recipe_step import step_dtypes  # noqa: E402
from mpcourse.amp.scaling_experiments import scale_trace  # noqa: E402
from mpcourse.amp.update_walk import master_walk  # noqa: E402
from mpcourse.views import dataflow_diagrams as flows  # noqa: E402
from mpcourse.views import diagrams  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def texts_by_gid(fig) -> dict[str, str]:
    return {t.get_gid(): t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid()}


def expected_step(param_dtype, autocast_dtype):
    """What torch's own rules say each tensor of a step is, without the hooks of step_dtypes."""
    x, w = torch.randn(4, 8, dtype=param_dtype), torch.randn(16, 8, dtype=param_dtype)
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        activation = F.linear(x, w)
        loss = F.cross_entropy(activation, torch.zeros(4, dtype=torch.long))
    return {"parameter": param_dtype, "matmul_operand": activation.dtype,
            "activation": activation.dtype, "loss": loss.dtype,
            "activation_grad": activation.dtype,  # autograd: a gradient has its tensor's dtype
            "parameter_grad": param_dtype,
            "optimizer_grad": torch.float32, "optimizer_param": torch.float32}


RECIPES = [(torch.float32, None, False), (torch.float32, torch.bfloat16, False),
           (torch.float32, torch.float16, True), (torch.float16, None, True),
           (torch.bfloat16, None, False)]


@pytest.mark.parametrize("param_dtype,autocast_dtype,grad_scaler", RECIPES)
def test_step_dtypes_are_the_dtypes_torch_gives(param_dtype, autocast_dtype, grad_scaler):
    recorded = step_dtypes(param_dtype, autocast_dtype, grad_scaler).tensor_dtypes()
    for name, dtype in expected_step(param_dtype, autocast_dtype).items():
        assert recorded[name] == dtype, name
    assert (recorded["scaled_loss"] is not None) == grad_scaler


@pytest.mark.parametrize("param_dtype,autocast_dtype,grad_scaler", RECIPES)
def test_dtype_flow_draws_the_recorded_step(param_dtype, autocast_dtype, grad_scaler):
    step = step_dtypes(param_dtype, autocast_dtype, grad_scaler)
    fig = diagrams.dtype_flow(step)
    labels = texts_by_gid(fig)
    recorded = step.tensor_dtypes()
    state = diagrams.dtype_label(recorded.pop("optimizer_state"))
    for name, dtype in recorded.items():
        if dtype is not None:
            assert labels[name] == diagrams.dtype_label(dtype), name
    assert ("scaled_loss" in labels) == grad_scaler
    assert f"AdamW updates (state {state})" in [t.get_text() for t in fig.axes[0].texts]
    assert fig.axes[0].get_title() == \
        f"One training step: {diagrams.recipe_title(step.recipe)}"


def test_dtype_flow_changes_with_the_recipe():
    fp32 = texts_by_gid(diagrams.dtype_flow(step_dtypes(torch.float32)))
    bf16 = texts_by_gid(diagrams.dtype_flow(step_dtypes(torch.float32, torch.bfloat16)))
    masters = texts_by_gid(diagrams.dtype_flow(step_dtypes(torch.float16, None, True)))
    assert (fp32["matmul_operand"], bf16["matmul_operand"]) == ("fp32", "bf16")
    assert (masters["parameter"], masters["parameter_grad"], masters["optimizer_grad"]) == \
        ("fp16", "fp16", "fp32")
    assert diagrams.recipe_title(step_dtypes(torch.float16, torch.float16, True).recipe) == \
        "fp16 parameters with FP32 masters + autocast fp16 + GradScaler"


def test_step_dtypes_rejects_an_unknown_recipe():
    with pytest.raises(ValueError, match="param_dtype must be one of .* got torch.float64"):
        step_dtypes(torch.float64)
    with pytest.raises(ValueError, match="autocast_dtype must be one of .* got torch.float32"):
        step_dtypes(torch.float32, torch.float32)


def test_one_colour_per_dtype_everywhere():
    colours = list(diagrams.DTYPE_COLOURS.values())
    assert len(set(colours)) == len(colours) == 6
    assert diagrams.dtype_colour(torch.bfloat16) == diagrams.DTYPE_COLOURS["bf16"]
    assert diagrams.dtype_colour(torch.float8_e5m2) == diagrams.DTYPE_COLOURS["fp8_e5m2"]
    assert diagrams.dtype_colour(torch.int64) == diagrams.OTHER_COLOUR


def test_master_walk_is_an_fp32_sum_and_its_bf16_rounding():
    walks = master_walk(start=1.0, update=1e-3, steps=50)
    exact = [torch.tensor(1.0)]
    for _ in range(50):
        exact.append(exact[-1] + torch.tensor(1e-3))
    exact = torch.stack(exact)
    assert torch.equal(walks.master, exact.double())         # summed in FP32, bit for bit
    assert torch.equal(walks.working, exact.bfloat16().double())
    assert torch.equal(walks.alone, torch.ones(51, dtype=torch.float64))  # 1 + 1e-3 rounds to 1


def test_master_weight_loop_draws_the_recorded_step_and_walks():
    walks = master_walk(start=1.0, update=1e-3, steps=50)
    fig = diagrams.master_weight_loop(step_dtypes(torch.bfloat16), walks)
    labels = texts_by_gid(fig)
    assert (labels["master"], labels["working"], labels["working_grad"], labels["master_grad"]) \
        == ("fp32", "bf16", "bf16", "fp32")
    lines = {line.get_gid(): list(line.get_ydata()) for line in fig.axes[1].lines}
    assert lines["master_walk"] == walks.master.tolist()
    assert lines["working_walk"] == walks.working.tolist()
    assert lines["alone_walk"] == walks.alone.tolist()


def test_master_weight_loop_needs_a_step_with_masters():
    with pytest.raises(ValueError, match="no masters: its parameters are torch.float32"):
        diagrams.master_weight_loop(step_dtypes(torch.float32, torch.bfloat16),
                                    master_walk(1.0, 1e-3, 10))


def torch_scales(steps, overflow_steps, init_scale, growth_interval):
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scales = []
    for step in range(steps):
        optimizer.zero_grad()
        scaler.scale((weight + 1.0).sum()).backward()
        if step in overflow_steps:
            weight.grad.fill_(float("nan"))
        scales.append(scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()
    return scales


@pytest.mark.parametrize("overflow_steps,growth_interval", [((6, 25), 5), ((0, 1, 2, 30), 3)])
def test_scale_trace_is_torch_grad_scalers(overflow_steps, growth_interval):
    trace = scale_trace(40, overflow_steps, 2.0**10, growth_interval)
    assert trace.scales == torch_scales(40, overflow_steps, 2.0**10, growth_interval)
    fig = diagrams.loss_scaler_states(trace)
    (line,) = [l for l in fig.axes[1].lines if l.get_gid() == "scale_trace"]
    assert list(line.get_ydata()) == trace.scales
    spans = [p.get_patch_transform().transform(p.get_path().vertices)[:, 0]
             for p in fig.axes[1].patches]
    assert sorted((x.min(), x.max()) for x in spans) == [(s - 0.5, s + 0.5) for s in overflow_steps]
    assert fig.axes[1].get_title() == f"A real GradScaler, growth_interval={growth_interval}"


def test_scale_trace_rejects_overflows_outside_the_run():
    with pytest.raises(ValueError, match=r"overflow_steps must lie in \[0, 10\), got \[10\]"):
        scale_trace(10, (10,))


def test_autocast_blocks_are_coloured_by_the_traced_dtypes():
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
    x = torch.randn(2, 8, 32)
    with mpcourse.amp.autocast("cpu", dtype=torch.bfloat16, trace=True) as region:
        y = block(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert block(x).dtype == y.dtype
    fig = flows.autocast_blocks(region.trace)
    patches = {p.get_gid(): p for p in fig.axes[0].patches if p.get_gid()}
    assert len(patches) == len(region.trace)
    for i, record in enumerate(region.trace):
        edge = patches[f"op{i}"].get_edgecolor()[:3]
        assert edge == pytest.approx(to_rgb(diagrams.dtype_colour(record.output_dtype)))
    linears = [i for i, r in enumerate(region.trace) if r.op == "linear"]
    assert linears and all(patches[f"op{i}"].get_edgecolor()[:3] ==
                           pytest.approx(to_rgb(diagrams.DTYPE_COLOURS["bf16"])) for i in linears)
    labels = texts_by_gid(fig)
    for i, record in enumerate(region.trace):
        names = ",".join(diagrams.dtype_label(d) for d in record.input_dtypes)
        assert labels[f"inputs{i}"] == f"in: {names}"
        casts = sum(not c.cached for c in record.casts)   # casts autocast made for this op
        assert labels.get(f"casts{i}", "0 casts").split()[0] == str(casts)
    assert sum(f"casts{i}" in labels for i in linears) == len(linears)   # each linear casts


def test_autocast_blocks_rejects_what_is_not_a_trace():
    with pytest.raises(ValueError, match="Trace"):
        flows.autocast_blocks([])


def fp8_layer_after_one_step(dtype=torch.float32):
    layer = Fp8Linear(2, 2, dtype=dtype)
    x = torch.ones(1, 2, dtype=dtype, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    return layer, x, y


def test_fp8_dataflow_states_the_formats_limits():
    fig = flows.fp8_linear_dataflow(*fp8_layer_after_one_step())
    labels = texts_by_gid(fig)
    assert (labels["format_x"], labels["format_w"], labels["format_g"]) == \
        ("fp8_e4m3", "fp8_e4m3", "fp8_e5m2")
    texts = " ".join(t.get_text() for t in fig.axes[0].texts) + fig.axes[0].get_title()
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert f"{torch.finfo(dtype).max:g}" in texts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_dataflow_reads_the_dtypes_off_the_layers_step(dtype):
    layer, x, y = fp8_layer_after_one_step(dtype)
    labels = texts_by_gid(flows.fp8_linear_dataflow(layer, x, y))
    assert labels["weight"] == diagrams.dtype_label(layer.weight.dtype) == \
        diagrams.dtype_label(dtype)
    assert labels["input"] == diagrams.dtype_label(x.dtype)
    assert labels["output"] == labels["output_grad"] == diagrams.dtype_label(y.dtype)
    assert labels["grads"] == diagrams.dtype_label(layer.weight.grad.dtype)


def test_fp8_dataflow_needs_a_delayed_layer_after_its_step():
    x = torch.ones(1, 2, requires_grad=True)
    with pytest.raises(ValueError, match="no gradient: run one forward and backward pass"):
        layer = Fp8Linear(2, 2)
        flows.fp8_linear_dataflow(layer, x, layer(x))
    with pytest.raises(ValueError, match="delayed scaling .* got Fp8Linear.*recipe=current"):
        flows.fp8_linear_dataflow(Fp8Linear(2, 2, recipe="current"), x, x)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_wire_bytes_match_the_ring_formulas(world_size):
    n, w = 1024 * 8, world_size
    assert wire_bytes("ddp", n, w) == {"all_reduce": 2 * (w - 1) / w * n * 4}
    assert wire_bytes("fsdp2", n, w, torch.bfloat16, torch.float32) == {
        "all_gather_forward": (w - 1) / w * n * 2, "all_gather_backward": (w - 1) / w * n * 2,
        "reduce_scatter": (w - 1) / w * n * 4}
    kept = wire_bytes("fsdp2", n, w, torch.bfloat16, torch.bfloat16,
                            reshard_after_forward=False)
    assert kept["all_gather_backward"] == 0 and kept["reduce_scatter"] == (w - 1) / w * n * 2
    # DDP under a 16-bit compress hook all-reduces in 16 bits: half the FP32 bytes
    assert wire_bytes("ddp", n, w, reduce_dtype=torch.bfloat16) == {"all_reduce": 2 * (w - 1) / w * n * 2}


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_fsdp2_with_bf16_params_sends_what_ddp_sends_unless_it_keeps_them(world_size):
    # (W-1)/W * N * (2 + 2 + 4) bytes against 2 (W-1)/W * N * 4: equal at every world size
    ddp = wire_bytes("ddp", 4096, world_size)["all_reduce"]
    assert sum(wire_bytes("fsdp2", 4096, world_size).values()) == ddp
    kept = wire_bytes("fsdp2", 4096, world_size, reshard_after_forward=False)
    assert sum(kept.values()) == ddp * 3 // 4


def test_wire_bytes_rejects_bad_arguments():
    with pytest.raises(ValueError, match="strategy 'zero3'"):
        wire_bytes("zero3", 10, 2)
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        wire_bytes("ddp", 10, 0)
    with pytest.raises(ValueError, match="collective 'broadcast'"):
        wire_bytes_of_payload("broadcast", 10, 2)
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        wire_bytes_of_payload("all_reduce", 10, 0)


@pytest.fixture
def fake_process_group():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield 4
    dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_wire_bytes_agree_with_what_real_fsdp2_hands_to_collectives(fake_process_group):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from mpcourse.distributed import CollectiveCounter
    from mpcourse.train.models import Block, GPTConfig
    config = GPTConfig(d_model=32, n_heads=4)
    torch.manual_seed(0)
    model = nn.Sequential(Block(config), Block(config))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    counter = CollectiveCounter()
    with counter:
        model(torch.randn(2, 8, 32)).float().sum().backward()
    per_block = wire_bytes("fsdp2", sum(p.numel() for p in Block(config).parameters()),
                           fake_process_group)
    w = fake_process_group
    assert wire_bytes_of_payload("all_gather", counter.bytes["all_gather"], w) == \
        2 * (per_block["all_gather_forward"] + per_block["all_gather_backward"])
    assert wire_bytes_of_payload("reduce_scatter", counter.bytes["reduce_scatter"], w) == \
        2 * per_block["reduce_scatter"]


def test_collective_timeline_labels_carry_the_wire_bytes():
    fig = flows.collective_timeline(world_size=4, num_blocks=3)
    top, bottom = fig.axes
    fsdp = sum(1 for p in top.patches if p.get_gid() == "reduce_scatter")
    gathers = sum(1 for p in top.patches if p.get_gid() in ("all_gather_forward",
                                                            "all_gather_backward"))
    assert (fsdp, gathers) == (3, 6)
    assert sum(1 for p in bottom.patches if p.get_gid() == "all_reduce") == 3
    from mpcourse.train.models import Block, GPTConfig
    n = sum(p.numel() for p in Block(GPTConfig()).parameters())
    total = 3 * sum(wire_bytes("fsdp2", n, 4).values())
    assert f"{total / 1e3:.0f} kB" in top.get_title()
    kept = flows.collective_timeline(world_size=4, num_blocks=3, reshard_after_forward=False)
    assert sum(1 for p in kept.axes[0].patches if p.get_gid() == "all_gather_backward") == 0


def test_collective_timeline_draws_the_blocks_of_the_model_it_is_given():
    from mpcourse.train.models import Block, GPTConfig
    config = GPTConfig(d_model=32, n_heads=2, n_layers=3)
    top, bottom = flows.collective_timeline(world_size=2, model_config=config).axes
    assert sum(1 for p in top.patches if p.get_gid() == "reduce_scatter") == config.n_layers
    n = sum(p.numel() for p in Block(config).parameters())
    assert f"{3 * sum(wire_bytes('fsdp2', n, 2).values()) / 1e3:.0f} kB" in top.get_title()
    with pytest.raises(ValueError, match="num_blocks must be a positive integer, got 0"):
        flows.collective_timeline(num_blocks=0)
