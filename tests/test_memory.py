"""mpcourse.memory.accounting: the worked numbers exactly, checked against what torch really allocates
(measured with mpcourse.memory.measure)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mpcourse.memory import accounting as memory
from mpcourse.memory.accounting import (MemoryBreakdown, attention_parameters, bytes_per_element, calculator,
                                         largest_batch, layer_parameters, tensor_bytes, training_memory,
                                         transformer_memory, transformer_parameters,
                                         transformer_saved_tensors)
from mpcourse.memory.measure import measure_peak_memory, measure_saved_activations

MB = 10**6
M = 10**6


class PreNormGPT(nn.Module):
    """GPT-style model from torch.nn pieces: the architecture transformer_memory describes."""

    def __init__(self, vocab, seq_len, d_model, n_layers, n_heads, tied=True):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d_model)
        self.head = None if tied else nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len),
                             persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T))
        x = self.blocks(x, mask=self.mask[:T, :T].to(x.dtype), is_causal=True)
        x = self.ln_f(x)
        logits = F.linear(x, self.tok.weight) if self.head is None else self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def small_model(d_model=32, n_layers=2, n_heads=2, seq_len=16, vocab=50, tied=True, seed=0):
    torch.manual_seed(seed)
    return PreNormGPT(vocab, seq_len, d_model, n_layers, n_heads, tied)


# --- the worked examples ----------------------------------------------------------------

def test_one_tensor_of_ten_million_elements():
    assert tensor_bytes(10 * M, torch.float32) == 40 * MB
    assert tensor_bytes(10 * M, torch.float16) == 20 * MB
    assert tensor_bytes(10 * M, torch.bfloat16) == 20 * MB
    saving = tensor_bytes(10 * M, torch.float32) - tensor_bytes(10 * M, torch.bfloat16)
    assert saving == 20 * MB and saving / (40 * MB) == 0.5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                   torch.float8_e4m3fn, torch.int64, torch.int8, torch.bool])
def test_bytes_agree_with_real_tensors(dtype):
    assert bytes_per_element(dtype) == torch.empty(0, dtype=dtype).element_size()
    assert tensor_bytes(1000, dtype) == torch.empty(1000, dtype=dtype).nbytes


def components_mb(b: MemoryBreakdown):
    return (b.parameters / MB, b.master_parameters / MB, b.activations / MB, b.gradients / MB,
            b.optimizer_state / MB)


def test_worked_network_fp32_baseline():
    b = training_memory(10 * M, 20 * M, "fp32", "adam", gradients=10 * M)
    assert components_mb(b) == (40, 0, 80, 40, 80)
    assert b.total == 240 * MB and b.mb == 240


def test_worked_network_amp_has_no_master_copy():
    b = training_memory(10 * M, 20 * M, "amp", "adam")
    assert components_mb(b) == (40, 0, 40, 40, 80)
    assert b.master_parameters == 0
    assert b.total == 200 * MB
    fp32 = training_memory(10 * M, 20 * M, "fp32", "adam")
    saving = fp32.total - b.total
    assert saving == 40 * MB
    assert round(100 * saving / fp32.total, 1) == 16.7


def test_worked_network_master_weights():
    b = training_memory(10 * M, 20 * M, "master_weights", "adam")
    assert components_mb(b) == (20, 40, 40, 20, 80)
    assert b.total == 200 * MB


def test_weights_alone_4n_against_6n():
    n = 10 * M
    fp32 = training_memory(n, 0, "fp32", "sgd")
    master = training_memory(n, 0, "master_weights", "sgd")
    assert fp32.parameters + fp32.master_parameters == 4 * n
    assert master.parameters + master.master_parameters == 6 * n


def test_transformer_layer_parameters_at_d_4096():
    d = 4096
    assert attention_parameters(d, bias=False) == 4 * d * d == 67_108_864
    assert round(attention_parameters(d) / 1e6, 1) == 67.1
    layer = sum(layer_parameters(d).values())
    assert round(layer / 1e6) == 201 == round(12 * d * d / 1e6)
    assert layer / attention_parameters(d) > 2.99  # the 4 d^2 shortcut misses two thirds


@pytest.mark.parametrize("d_model,n_heads", [(64, 4), (4096, 32)])
def test_layer_parameters_agree_with_torch(d_model, n_heads):
    layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, device="meta")
    attention = sum(p.numel() for p in layer.self_attn.parameters())
    assert layer_parameters(d_model)["attention"] == attention
    assert sum(layer_parameters(d_model).values()) == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("tied", [True, False])
def test_transformer_parameters_agree_with_the_model(tied):
    model = small_model(d_model=48, n_layers=3, n_heads=3, seq_len=20, vocab=70, tied=tied)
    assert transformer_parameters(48, 3, 20, 70, tied) == sum(p.numel() for p in model.parameters())


def test_one_layer_saves_sixteen_values_per_token_and_feature():
    B, T, d, h = 4, 128, 256, 4
    stats = 4 * (2 * 2 * B * T + B * h * T)  # LayerNorm mean and 1/std, attention log-sum-exp
    assert memory.layer_saved_bytes(d, T, B, "fp32", n_heads=h) == 16 * B * T * d * 4 + stats
    assert memory.layer_saved_bytes(d, T, B, "amp", n_heads=h) == (14 * 2 + 2 * 4) * B * T * d + stats
    assert memory.layer_saved_bytes(d, 2 * T, B, "fp32") == 2 * memory.layer_saved_bytes(d, T, B, "fp32")


def test_activations_grow_with_batch_times_sequence_while_layers_stay_fixed():
    def per_layer(batch, seq_len, d_model=256):
        one, two = (transformer_memory(d_model, n, seq_len, batch, 1000, "fp32", n_heads=4)
                    for n in (1, 2))
        return two.activations - one.activations, two.parameters - one.parameters

    acts, params = per_layer(batch=4, seq_len=128)
    assert per_layer(8, 128) == (2 * acts, params)
    assert per_layer(4, 256) == (2 * acts, params)
    assert acts == 4 * (16 * 4 * 128 * 256 + 4 * 4 * 128 + 4 * 4 * 128)


# --- training_memory against torch's own tensors ------------------------------------------

OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
              "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
              "adam": lambda p: torch.optim.Adam(p), "adamw": lambda p: torch.optim.AdamW(p)}


def state_bytes(optimizer):
    """Bytes of the optimizer's per-parameter state tensors (not its scalar step counters)."""
    return sum(v.nbytes for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("frozen", [False, True])
def test_fp32_and_amp_match_torch_parameters_gradients_and_optimizer_state(name, frozen):
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    if frozen:
        model[0].requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = OPTIMIZERS[name](trainable)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(4, 16)).float().square().mean()
    loss.backward()
    optimizer.step()
    n = sum(p.numel() for p in model.parameters())
    g = sum(p.numel() for p in trainable)
    for layout in ("fp32", "amp"):
        b = training_memory(n, 0, layout, name, gradients=g)
        assert b.parameters == sum(p.nbytes for p in model.parameters())
        assert b.gradients == sum(p.grad.nbytes for p in trainable)  # FP32 even under autocast
        assert b.optimizer_state == state_bytes(optimizer)


def test_master_weights_match_a_16_bit_model_with_fp32_masters():
    model = nn.Linear(16, 8).to(torch.bfloat16)
    masters = [p.detach().float() for p in model.parameters()]
    optimizer = torch.optim.Adam([nn.Parameter(m) for m in masters])
    model(torch.randn(4, 16, dtype=torch.bfloat16)).float().sum().backward()
    for master, p in zip(optimizer.param_groups[0]["params"], model.parameters()):
        master.grad = p.grad.float()
    optimizer.step()
    n = sum(p.numel() for p in model.parameters())
    b = training_memory(n, 0, "master_weights", "adam")
    assert b.parameters == sum(p.nbytes for p in model.parameters())
    assert b.gradients == sum(p.grad.nbytes for p in model.parameters())
    assert b.master_parameters == sum(m.nbytes for m in masters)
    assert b.optimizer_state == state_bytes(optimizer)


def test_breakdown_units_and_table():
    b = training_memory(10 * M, 20 * M, "amp")
    assert b.total == sum(b.components().values())
    assert b.mb == 200.0 and b.mib == pytest.approx(200 * MB / 2**20)
    table = repr(b)
    for line in ("layout=amp", "optimizer=adam", "parameters", "master parameters",
                 "activations", "gradients", "optimizer state", "200.0 MB"):
        assert line in table
    assert "weight copies" not in table


# --- bad input --------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [-1, 1.5, 10e6, "10", True, None])
def test_counts_must_be_non_negative_integers(bad):
    with pytest.raises(ValueError, match="non-negative integer"):
        training_memory(bad, 0, "fp32")
    with pytest.raises(ValueError, match="activations"):
        training_memory(10, bad, "fp32")
    with pytest.raises(ValueError, match="numel"):
        tensor_bytes(bad, torch.float32)


def test_unknown_layout_and_optimizer_list_the_allowed_values():
    with pytest.raises(ValueError, match="'fp16'.*'fp32', 'amp', 'master_weights'"):
        training_memory(10, 10, "fp16")
    with pytest.raises(ValueError, match="'lamb'.*'sgd', 'sgd_momentum', 'adam', 'adamw'"):
        training_memory(10, 10, "amp", "lamb")
    with pytest.raises(ValueError, match="'master'.*'master_weights'"):
        transformer_memory(64, 1, 8, 1, 10, "master")
    with pytest.raises(ValueError, match="'rmsprop'.*'adamw'"):
        transformer_memory(64, 1, 8, 1, 10, "amp", "rmsprop")


@pytest.mark.parametrize("bad", ["float32", torch.float32.__class__, 4, torch.tensor(1.0)])
def test_dtype_must_be_a_torch_dtype(bad):
    with pytest.raises(ValueError, match="torch.dtype.*torch.float32"):
        bytes_per_element(bad)


def test_more_gradients_than_parameters_is_an_error():
    with pytest.raises(ValueError, match="cannot exceed"):
        training_memory(10, 0, "fp32", gradients=11)


# --- the estimate against what autograd really saves ---------------------------------------

@pytest.mark.parametrize("size", [dict(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch=4,
                                       vocab=50),
                                  dict(d_model=96, n_layers=3, n_heads=3, seq_len=32, batch=2,
                                       vocab=300)])
@pytest.mark.parametrize("layout,autocast_dtype", [("fp32", None), ("amp", torch.bfloat16)])
def test_transformer_estimate_agrees_with_measurement(size, layout, autocast_dtype):
    model = small_model(size["d_model"], size["n_layers"], size["n_heads"], size["seq_len"],
                        size["vocab"])
    idx = torch.randint(size["vocab"], (size["batch"], size["seq_len"]))
    targets = torch.randint(size["vocab"], (size["batch"], size["seq_len"]))
    measured = measure_saved_activations(model, idx, targets, autocast_dtype=autocast_dtype)
    predicted = transformer_memory(**size, layout=layout)
    assert predicted.activations + predicted.weight_copies == pytest.approx(measured.total,
                                                                            rel=0.10)
    assert predicted.weight_copies == pytest.approx(measured.weight_copies, rel=0.10)
    assert "unattributed" not in measured.by("op")
    for term in transformer_saved_tensors(**size, layout=layout):
        assert term.elements > 0


def test_autocast_does_not_halve_saved_activations():
    model = small_model()
    idx = torch.randint(50, (4, 16))
    fp32 = measure_saved_activations(model, idx, idx)
    amp = measure_saved_activations(model, idx, idx, autocast_dtype=torch.bfloat16)
    assert amp.activations > 0.5 * fp32.activations * 1.05
    assert amp.by("dtype")["float32"] > 0.1 * amp.total
    assert amp.by("dtype")["bfloat16"] > 0.5 * amp.total


def test_master_weights_estimate_agrees_with_a_16_bit_model():
    size = dict(d_model=64, n_layers=2, n_heads=2, seq_len=16, batch=4, vocab=80)
    model = small_model(size["d_model"], size["n_layers"], size["n_heads"], size["seq_len"],
                        size["vocab"]).to(torch.bfloat16)
    idx = torch.randint(80, (4, 16))
    measured = measure_saved_activations(model, idx, idx)
    predicted = transformer_memory(**size, layout="master_weights")
    assert predicted.activations == pytest.approx(measured.total, rel=0.10)
    assert measured.weight_copies == 0 and predicted.weight_copies == 0


# --- peak memory ------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU accounting path")
def test_cpu_peak_counts_parameters_gradients_state_and_saved_tensors():
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters())
    idx = torch.randint(50, (4, 16))

    def step():
        model(idx, idx).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    def two_steps():
        step()
        step()

    peak = measure_peak_memory(two_steps, model=model, optimizer=optimizer)
    n_bytes = sum(p.nbytes for p in model.parameters())
    assert peak.device == "cpu"
    # in step two, at the end of the forward pass, everything is alive at once: the gradients
    # (zeroed, not freed), Adam's state from step one and all that the forward pass saved
    assert peak.parts["parameters"] == n_bytes
    assert peak.parts["gradients"] == n_bytes
    scalars = 4 * len(list(model.parameters()))  # Adam's FP32 step counters
    assert peak.parts["optimizer state"] == 2 * n_bytes + scalars
    # the graph of step one is freed before step two: the peak is one step's saved tensors
    assert peak.parts["saved for backward"] == measure_saved_activations(model, idx, idx).total
    assert peak.largest == {kind: peak.parts[kind] for kind in peak.largest}
    assert peak.peak == sum(peak.parts.values())
    assert "not seen" in repr(peak)


# --- the calculator and the largest batch that fits ---------------------------------------

def test_calculator_scales_activations_with_batch_and_sequence():
    layouts, chosen = calculator(10 * M, 1000, 4, 256, "amp", "adamw")
    assert list(layouts) == ["fp32", "amp", "master_weights"]
    assert chosen == layouts["amp"] == training_memory(10 * M, 1000 * 4 * 256, "amp", "adamw")
    doubled, _ = calculator(10 * M, 1000, 8, 256, "amp", "adamw")
    assert doubled["fp32"].activations == 2 * layouts["fp32"].activations
    assert doubled["fp32"].parameters == layouts["fp32"].parameters
    with pytest.raises(ValueError, match="allowed"):
        calculator(10, 1, 1, 1, "bf16", "adam")


def test_largest_batch_is_the_edge_of_the_estimate():
    args = dict(d_model=256, n_layers=4, seq_len=128, vocab=1000, layout="amp")
    budget = 500 * MB
    b = largest_batch(budget, **args)
    assert b > 0
    assert transformer_memory(batch=b, **args).total <= budget
    assert transformer_memory(batch=b + 1, **args).total > budget
    assert largest_batch(1000, **args) == 0
