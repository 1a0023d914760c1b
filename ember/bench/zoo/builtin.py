"""The ``builtin`` suite: models that need nothing but torch (the default of ``ember bench``).

``mlp`` (matmuls and pointwise), ``convnet`` (convolution, batch norm, pooling),
``transformer_block`` (layer norm, hand-written attention with softmax, matmuls) and
``tiny_gpt`` (a small decoder language model). Input sizes are small on purpose: the
benchmark and the model tests run on a 2-core CPU.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ember.bench.zoo.catalog import register_model


class MLP(nn.Module):
    def __init__(self, width: int = 512, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.gelu(layer(x))
        return self.head(x)


@register_model("mlp", description="4 x (Linear 512 + GELU), batch 64", batch_size=64)
def _mlp(device, batch_size):
    return MLP(), (torch.randn(batch_size, 512, device=device),)


class ConvNet(nn.Module):
    # The later convolutions stride 2: at full resolution the 3rd layer alone costs ~10 GFLOP,
    # far too slow for a 2-core benchmark.
    def __init__(self, channels=(3, 16, 32, 64), strides=(1, 2, 2), classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                          nn.BatchNorm2d(c_out), nn.ReLU())
            for c_in, c_out, stride in zip(channels, channels[1:], strides)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels[-1], classes)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.fc(torch.flatten(x, 1))


@register_model("convnet", description="3 x (conv-bn-relu), pool, linear; batch 16 x 3x64x64",
                batch_size=16)
def _convnet(device, batch_size):
    model = ConvNet()
    # Non-trivial running statistics, so eval-mode batch norm is not the identity.
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(batch_size, 3, 64, 64, device=device),)


class SelfAttention(nn.Module):
    """Multi-head self-attention written out (no fused SDPA), so its ops are visible."""

    def __init__(self, dim: int, heads: int, causal: bool = False):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        head_dim = dim // self.heads

        def split_heads(t):
            return t.view(batch, seq, self.heads, head_dim).transpose(1, 2)

        q, k, v = split_heads(self.q(x)), split_heads(self.k(x)), split_heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        if self.causal:
            future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(batch, seq, dim)
        return self.out(y)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int = 256, heads: int = 4, mlp_ratio: int = 4, causal: bool = False):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


@register_model("transformer_block", description="pre-LN block, 4 heads; batch 8 x seq 128 x 256",
                batch_size=8)
def _transformer_block(device, batch_size):
    return TransformerBlock(), (torch.randn(batch_size, 128, 256, device=device),)


class TinyGPT(nn.Module):
    """A decoder language model: token and position embeddings, causal pre-LN blocks, a final
    layer norm and an LM head tied to the token embedding."""

    def __init__(self, vocab: int = 2048, dim: int = 128, layers: int = 2, heads: int = 4,
                 max_len: int = 256):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, causal=True)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(dim)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tokens.weight.t()


@register_model("tiny_gpt", description="decoder LM, 2 causal blocks, hidden 128, vocab 2048; "
                                        "batch 4 x 128 token ids", batch_size=4)
def _tiny_gpt(device, batch_size):
    return TinyGPT(), (torch.randint(0, 2048, (batch_size, 128), device=device),)
