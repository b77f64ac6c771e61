"""A small GPT: the model the training lab trains in every precision.

It has the parts whose numerics matter in mixed precision and nothing else: pre-norm
transformer blocks (LayerNorm, causal self-attention through `scaled_dot_product_attention`,
a GELU MLP), learned positions, and an output layer that shares its weight with the token
embedding. Matmuls dominate its time, so it shows what 16-bit arithmetic buys, and LayerNorm,
softmax and the loss show what autocast keeps in FP32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.memory.accounting import check_architecture


@dataclass(frozen=True)
class GPTConfig:
    """The shape of the model. GPT-2 small is d_model=768, n_layers=12, n_heads=12, seq_len=1024."""
    vocab_size: int = 256
    seq_len: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4

    def __post_init__(self):
        check_architecture(vocab_size=self.vocab_size, seq_len=self.seq_len, d_model=self.d_model,
                           n_layers=self.n_layers, n_heads=self.n_heads)


class CausalSelfAttention(nn.Module):
    """Each position attends to itself and the positions before it."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        heads = lambda t: t.view(batch, seq, self.n_heads, -1).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, d_model))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
                                 nn.Linear(4 * config.d_model, config.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token ids (batch, seq) in, next-token logits (batch, seq, vocab) out."""

    def __init__(self, config: GPTConfig):
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT takes a GPTConfig, got {type(config).__name__}")
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: one matrix reads and writes tokens
        self.apply(_init_weights)
        for block in self.blocks:  # GPT-2: scale the residual projections by depth
            for proj in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * config.n_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[1]
        if seq > self.config.seq_len:
            raise ValueError(f"sequence of {seq} tokens is longer than seq_len={self.config.seq_len}")
        positions = torch.arange(seq, device=idx.device)
        x = self.token_embedding(idx) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))

    def num_parameters(self) -> int:
        """Distinct parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next-token predictions, in nats."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
