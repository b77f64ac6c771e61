"""Where the bytes of a training step go, counted from first principles.

"Mixed precision halves memory" is true of one tensor stored in 16 bits instead of 32, and of
nothing larger. A training step holds five kinds of tensors (parameters, a possible FP32 master
copy, the activations saved for backward, gradients, optimizer state), and which of them are
16-bit depends on the layout:

- ``"fp32"``: everything in FP32 (4 bytes per element).
- ``"amp"``: autocast over an FP32 model. Parameters, gradients and optimizer state stay FP32;
  the saved activations are (mostly) 16-bit. There is no master copy: the FP32 parameters are
  the masters.
- ``"master_weights"``: 16-bit working parameters, activations and gradients, plus a separate
  FP32 master copy of the parameters that the optimizer updates.

FP16 and BF16 both take 2 bytes, so the accounting does not depend on which one is used.
Optimizer state is FP32 in every layout. Sizes are in bytes; ``.mb`` is decimal (10**6 bytes),
``.mib`` binary (2**20 bytes).

`training_memory` is the worked accounting, `transformer_memory` an estimate from a transformer's
architecture. `mpcourse.memory.measure` measures a live process to keep both honest, and
`mpcourse.views.memory` draws the layouts side by side.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("fp32", "amp", "master_weights")

# FP32 state tensors the optimizer keeps per trainable parameter (torch.optim's defaults).
OPTIMIZER_STATES = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}

# Bytes per element of each role in each layout ("16-bit" is 2 bytes, FP16 or BF16 alike).
BYTES_PER_ROLE = {
    "fp32": {"parameters": 4, "master_parameters": 0, "activations": 4, "gradients": 4},
    "amp": {"parameters": 4, "master_parameters": 0, "activations": 2, "gradients": 4},
    "master_weights": {"parameters": 2, "master_parameters": 4, "activations": 2, "gradients": 2},
}
OPTIMIZER_STATE_BYTES = 4

MB = 10**6
MIB = 2**20


def _count(value, name: str) -> int:
    """`value` as a non-negative int, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a non-negative integer count, got {value!r} "
                         f"({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer count, got {value}")
    return value


def check_architecture(**sizes: int) -> None:
    """Refuse a transformer that cannot be built: each size (`d_model`, `n_heads`, `n_layers`,
    `seq_len` and the vocabulary, under the caller's names) a positive integer, and d_model split
    evenly into n_heads heads. `mpcourse.train.models.GPTConfig` and `transformer_memory` both
    call it, so the estimate only ever describes a model that exists."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if sizes["d_model"] % sizes["n_heads"]:
        raise ValueError(f"d_model={sizes['d_model']} must be divisible by n_heads={sizes['n_heads']}: "
                         f"each head takes d_model / n_heads of the model's dimensions")


def default_heads(d_model: int) -> int:
    """GPT-2's head count, one head per 64 dimensions (at least one), lowered to a divisor of
    d_model where 64 does not divide it, so that the default is a model that exists."""
    heads = max(1, _count(d_model, "d_model") // 64)
    while d_model % heads:
        heads -= 1
    return heads


def _choice(value, allowed, name: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(map(repr, allowed))}")
    return value


def bytes_per_element(dtype: torch.dtype) -> int:
    """Bytes one element of `dtype` occupies: 4 for torch.float32, 2 for float16 and bfloat16."""
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"expected a torch.dtype (e.g. torch.float32, torch.float16, "
                         f"torch.bfloat16, torch.float8_e4m3fn), got {dtype!r}")
    return dtype.itemsize


def tensor_bytes(numel: int, dtype: torch.dtype) -> int:
    """Bytes of a tensor of `numel` elements of `dtype` (the storage alone, no overhead)."""
    return _count(numel, "numel") * bytes_per_element(dtype)


@dataclass(frozen=True, repr=False)
class MemoryBreakdown:
    """Bytes of each kind of tensor a training step holds at its peak, and their total.

    `weight_copies` holds the 16-bit copies of weights that autocast makes and autograd keeps for
    backward; only `transformer_memory` counts them (the worked accounting leaves them out).
    The table printed as repr shows that row only when it is not zero.
    """
    parameters: int
    master_parameters: int
    activations: int
    gradients: int
    optimizer_state: int
    weight_copies: int = 0
    layout: str = ""
    optimizer: str = ""

    def __post_init__(self) -> None:
        for name in ("parameters", "master_parameters", "activations", "gradients", "optimizer_state",
                     "weight_copies"):
            _count(getattr(self, name), name)

    @property
    def total(self) -> int:
        return sum(self.components().values())

    @property
    def mb(self) -> float:
        """The total in decimal megabytes (10**6 bytes)."""
        return self.total / MB

    @property
    def mib(self) -> float:
        """The total in binary mebibytes (2**20 bytes)."""
        return self.total / MIB

    def components(self) -> dict[str, int]:
        """Bytes per component, in the order the table and the charts show them."""
        parts = {"parameters": self.parameters, "master parameters": self.master_parameters,
                 "activations": self.activations, "gradients": self.gradients,
                 "optimizer state": self.optimizer_state}
        if self.weight_copies:
            parts["16-bit weight copies"] = self.weight_copies
        return parts

    def __repr__(self) -> str:
        title = " ".join(filter(None, [f"layout={self.layout}" if self.layout else "",
                                       f"optimizer={self.optimizer}" if self.optimizer else ""]))
        lines = [f"MemoryBreakdown({title})"]
        lines += [f"  {name:<21}{size / MB:>12,.1f} MB" for name, size in self.components().items()]
        lines += ["  " + "-" * 36, f"  {'total':<21}{self.mb:>12,.1f} MB"]
        return "\n".join(lines)


def training_memory(params: int, activations: int, layout: str, optimizer: str = "adam",
                    gradients: int | None = None) -> MemoryBreakdown:
    """Bytes a training step holds, given element counts and a precision layout.

    params: parameter count. activations: elements saved for backward at the peak.
    gradients: trainable parameters, which receive gradients (default: all of them); the
    optimizer state and the FP32 master copy are kept for these only.
    The accounting counts the five tensor kinds and nothing else: no temporaries, no allocator
    overhead, and none of the 16-bit weight copies that autocast caches (see transformer_memory).
    """
    params = _count(params, "params")
    activations = _count(activations, "activations")
    trainable = params if gradients is None else _count(gradients, "gradients")
    if trainable > params:
        raise ValueError(f"gradients ({trainable}) cannot exceed params ({params}): "
                         "there is at most one gradient per parameter")
    _choice(layout, LAYOUTS, "layout")
    _choice(optimizer, OPTIMIZER_STATES, "optimizer")
    size = BYTES_PER_ROLE[layout]
    return MemoryBreakdown(
        parameters=params * size["parameters"],
        master_parameters=trainable * size["master_parameters"],
        activations=activations * size["activations"],
        gradients=trainable * size["gradients"],
        optimizer_state=trainable * OPTIMIZER_STATES[optimizer] * OPTIMIZER_STATE_BYTES,
        layout=layout, optimizer=optimizer)


def compare_layouts(params: int, activations: int, optimizer: str = "adam",
                    gradients: int | None = None) -> dict[str, MemoryBreakdown]:
    """`training_memory` for each of the three layouts, keyed by layout."""
    return {layout: training_memory(params, activations, layout, optimizer, gradients)
            for layout in LAYOUTS}


def calculator(params: int, activations_per_token: int, batch: int, seq_len: int,
               layout: str, optimizer: str) -> tuple[dict[str, MemoryBreakdown], MemoryBreakdown]:
    """The lesson's sliders as a plain function: all three layouts, and the one selected.

    Saved activations are `activations_per_token * batch * seq_len` elements: they grow with
    the batch and the sequence while the parameters stay fixed.
    """
    tokens = _count(batch, "batch") * _count(seq_len, "seq_len")
    activations = _count(activations_per_token, "activations_per_token") * tokens
    _choice(layout, LAYOUTS, "layout")
    layouts = compare_layouts(params, activations, optimizer)
    return layouts, layouts[layout]


# --- Transformers -------------------------------------------------------------------------

def attention_parameters(d_model: int, bias: bool = True) -> int:
    """The four d x d projections of one attention block (query, key, value, output)."""
    d = _count(d_model, "d_model")
    return 4 * d * d + (4 * d if bias else 0)


def layer_parameters(d_model: int, mlp_ratio: int = 4, bias: bool = True) -> dict[str, int]:
    """Parameters of one pre-norm transformer layer, by part; ``sum(...values())`` is the layer.

    With a 4x MLP the layer holds about 12 * d_model**2: 4 d^2 in attention, 8 d^2 in the MLP.
    """
    d = _count(d_model, "d_model")
    hidden = _count(mlp_ratio, "mlp_ratio") * d
    return {"attention": attention_parameters(d, bias),
            "mlp": 2 * d * hidden + ((hidden + d) if bias else 0),
            "layer_norms": 4 * d}


def transformer_parameters(d_model: int, n_layers: int, seq_len: int, vocab: int,
                           tied_embeddings: bool = True) -> int:
    """Parameters of the GPT-style model `transformer_memory` describes."""
    d = _count(d_model, "d_model")
    embeddings = _count(vocab, "vocab") * d + _count(seq_len, "seq_len") * d
    head = 0 if tied_embeddings else vocab * d
    return (embeddings + _count(n_layers, "n_layers") * sum(layer_parameters(d).values())
            + 2 * d + head)


@dataclass(frozen=True)
class SavedTerm:
    """One kind of tensor autograd saves for backward, in `transformer_saved_tensors`."""
    what: str
    elements: int
    bytes_per_element: int
    kind: str = "activation"

    @property
    def bytes(self) -> int:
        return self.elements * self.bytes_per_element


def transformer_saved_tensors(d_model: int, n_layers: int, seq_len: int, batch: int, vocab: int,
                              layout: str, n_heads: int | None = None) -> list[SavedTerm]:
    """Every tensor the model of `transformer_memory` saves for backward, by what it is.

    Under autocast ("amp") the residual stream stays FP32, so the inputs LayerNorm saves are
    4 bytes, as is the log-softmax of the loss; matmul inputs, attention and GELU are 16-bit.
    LayerNorm statistics and attention's log-sum-exp are counted as FP32 in every layout (a
    16-bit model on a CPU keeps LayerNorm's statistics in 16 bits: a difference under 1%).
    """
    d, L = _count(d_model, "d_model"), _count(n_layers, "n_layers")
    T, B, V = _count(seq_len, "seq_len"), _count(batch, "batch"), _count(vocab, "vocab")
    h = default_heads(d) if n_heads is None else _count(n_heads, "n_heads")
    _choice(layout, LAYOUTS, "layout")
    low = BYTES_PER_ROLE[layout]["activations"]   # matmul-side tensors
    kept = 2 if layout == "master_weights" else 4  # what autocast keeps in FP32
    tokens = B * T
    terms = [
        SavedTerm("layer norm inputs (residual stream)", L * 2 * tokens * d, kept),
        SavedTerm("layer norm mean and 1/std", L * 2 * 2 * tokens, 4),
        SavedTerm("q/k/v projection inputs", L * tokens * d, low),
        SavedTerm("attention q, k, v", L * 3 * tokens * d, low),
        SavedTerm("attention outputs (= output projection inputs)", L * tokens * d, low),
        SavedTerm("attention log-sum-exp", L * B * h * T, 4),
        SavedTerm("MLP inputs", L * tokens * d, low),
        SavedTerm("GELU inputs", L * 4 * tokens * d, low),
        SavedTerm("MLP output projection inputs", L * 4 * tokens * d, low),
        SavedTerm("final layer norm input", tokens * d, kept),
        SavedTerm("final layer norm mean and 1/std", 2 * tokens, 4),
        SavedTerm("LM head input", tokens * d, low),
        SavedTerm("log-softmax of the logits", tokens * V, kept),
        SavedTerm("token ids, positions and targets (int64)", 2 * tokens + T, 8),
    ]
    if layout == "amp":
        terms.append(SavedTerm("16-bit copies of matmul weights", L * 12 * d * d + V * d, 2,
                               kind="weight copy"))
    return terms


def layer_saved_bytes(d_model: int, seq_len: int, batch: int, layout: str,
                      n_heads: int | None = None) -> int:
    """Bytes one more transformer layer saves for backward: about 16 * batch * seq_len * d_model
    values, FP32 or 16-bit by layout (excluding autocast's weight copies, which do not grow)."""
    def activations(n_layers):
        return sum(t.bytes for t in transformer_saved_tensors(d_model, n_layers, seq_len, batch, 0,
                                                              layout, n_heads)
                   if t.kind == "activation")
    return activations(1) - activations(0)


def transformer_memory(d_model: int, n_layers: int, seq_len: int, batch: int, vocab: int,
                       layout: str, optimizer: str = "adam", *, n_heads: int | None = None,
                       tied_embeddings: bool = True) -> MemoryBreakdown:
    """Estimate a GPT-style transformer's training memory from its architecture.

    The architecture assumed (GPT-2 style):
    token embedding (vocab x d_model) plus a learned position embedding (seq_len x d_model);
    `n_layers` pre-norm blocks, x + attention(LayerNorm(x)) then x + MLP(LayerNorm(x)), with
    biases, attention through one fused q/k/v projection, `scaled_dot_product_attention` (a
    fused kernel that stores no seq_len x seq_len matrix) and an output projection, and a
    d -> 4d -> d MLP with GELU; no dropout; a final LayerNorm; an LM head without bias, tied to
    the token embedding unless `tied_embeddings=False`; and the cross-entropy loss. That is
    ``torch.nn.TransformerEncoderLayer(d, n_heads, 4 * d, dropout=0.0, activation="gelu",
    batch_first=True, norm_first=True)`` with a causal mask. `n_heads` defaults to d_model // 64
    (see `default_heads`); `check_architecture` refuses sizes no model has, as the model does.

    Activations are the tensors listed by `transformer_saved_tensors` (about 16 values per token
    and d_model in each layer, plus the log-softmax over the vocabulary). In the "amp" layout it
    also counts the 16-bit weight copies autocast saves for backward. Left out: temporaries freed
    within the step (such as the logits), the input batch, and allocator overhead.
    """
    if not isinstance(tied_embeddings, bool):
        raise TypeError(f"tied_embeddings must be True or False, got {tied_embeddings!r}")
    check_architecture(d_model=d_model, n_layers=n_layers, seq_len=seq_len, vocab=vocab,
                       n_heads=default_heads(d_model) if n_heads is None else n_heads)
    _count(batch, "batch")
    _choice(layout, LAYOUTS, "layout")
    _choice(optimizer, OPTIMIZER_STATES, "optimizer")
    terms = transformer_saved_tensors(d_model, n_layers, seq_len, batch, vocab, layout, n_heads)
    n = transformer_parameters(d_model, n_layers, seq_len, vocab, tied_embeddings)
    weights = training_memory(n, 0, layout, optimizer)
    return MemoryBreakdown(
        parameters=weights.parameters, master_parameters=weights.master_parameters,
        activations=sum(t.bytes for t in terms if t.kind == "activation"),
        gradients=weights.gradients, optimizer_state=weights.optimizer_state,
        weight_copies=sum(t.bytes for t in terms if t.kind == "weight copy"),
        layout=layout, optimizer=optimizer)


def largest_batch(memory_bytes: int, d_model: int, n_layers: int, seq_len: int, vocab: int,
                  layout: str, optimizer: str = "adam", **architecture) -> int:
    """The largest batch whose `transformer_memory` estimate fits in `memory_bytes` (0: none)."""
    memory_bytes = _count(memory_bytes, "memory_bytes")

    def total(batch):
        return transformer_memory(d_model, n_layers, seq_len, batch, vocab, layout, optimizer,
                                  **architecture).total

    fixed = total(0)
    per_sample = total(1) - fixed
    if per_sample <= 0:
        raise ValueError(f"a batch of this model needs no memory (d_model={d_model}, "
                         f"seq_len={seq_len}), so any batch fits")
    return max(0, (memory_bytes - fixed) // per_sample)
