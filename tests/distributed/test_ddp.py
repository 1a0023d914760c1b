"""Ember under DistributedDataParallel (issue 33): gloo on 2 CPU processes.

Both forms train like eager DDP: ``DDP(ember.compile(model))`` (DDP's own forward runs in
Python around the compiled module) and ``ember.compile(DDP(model))`` (DDP's forward is
captured; its ``_pre_forward``/``_post_forward`` bookkeeping runs in Python between graphs,
so ``no_sync()`` and buffer broadcast behave as in eager, and the wrapped model is one
graph). Each scenario trains for 3 SGD steps and compares every parameter and buffer with
eager DDP's on both ranks.

The two processes are spawned once for the module (``ranks.run_on_ranks``).
"""
from __future__ import annotations


import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from ranks import WORLD, requires_gloo, run_on_ranks, wrap

pytestmark = requires_gloo

STEPS = 3


class Block(nn.Module):
    """Pre-norm self-attention and MLP, as in a small transformer."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        att = (q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.blocks = nn.Sequential(Block(dim), Block(dim))
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        return self.head(self.blocks(x))


class TransformerWithSpare(TinyTransformer):
    """A parameter the forward never uses: DDP with ``find_unused_parameters`` must mark it
    ready by walking the autograd graph of the compiled output."""

    def __init__(self, dim=16):
        super().__init__(dim)
        self.spare = nn.Linear(dim, dim)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean((2, 3)))


def _batch(model_name, rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    shape = (4, 3, 8, 8) if model_name == "cnn" else (4, 6, 16)
    return torch.randn(shape, generator=g)


MODELS = {"transformer": TinyTransformer, "spare": TransformerWithSpare, "cnn": SmallCNN}

# name -> (model, form, no_sync accumulation, DDP keyword arguments)
SCENARIOS = {
    "transformer-ddp_of_compiled": ("transformer", "ddp_of_compiled", False, {}),
    "transformer-compiled_ddp": ("transformer", "compiled_ddp", False, {}),
    "transformer-compiled_ddp-no_sync": ("transformer", "compiled_ddp", True, {}),
    "transformer-ddp_of_compiled-no_sync": ("transformer", "ddp_of_compiled", True, {}),
    "cnn-ddp_of_compiled": ("cnn", "ddp_of_compiled", False, {}),
    "cnn-compiled_ddp": ("cnn", "compiled_ddp", False, {}),
    "cnn-compiled_ddp-no_sync": ("cnn", "compiled_ddp", True, {}),
    "spare-compiled_ddp-find_unused": ("spare", "compiled_ddp", False,
                                       {"find_unused_parameters": True}),
    "spare-ddp_of_compiled-find_unused": ("spare", "ddp_of_compiled", True,
                                          {"find_unused_parameters": True}),
    "transformer-compiled_ddp-static_graph": ("transformer", "compiled_ddp", False,
                                              {"static_graph": True}),
    # a wrapper around the DDP that runs eagerly still compiles it
    "transformer-compiled_wrapper": ("transformer", "compiled_wrapper", False, {}),
}


def _train(model_name, form, accumulate, ddp_kwargs, rank, counter=None):
    """Parameters and buffers after STEPS SGD steps; ``form`` "eager" is plain DDP."""
    torch.manual_seed(0)
    model = MODELS[model_name]()
    run, _ = wrap(model, form, ddp_kwargs, counter)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x = _batch(model_name, rank, step)
        if accumulate:      # half the batch without syncing, the other half syncs
            with run.no_sync():
                run(x[:2]).square().mean().backward()
            run(x[2:]).square().mean().backward()
        else:
            run(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return ([p.detach().clone() for p in model.parameters()],
            [b.clone() for b in model.buffers()])


def _compare(name, rank):
    from ember.testing import CompileCounter
    model_name, form, accumulate, ddp_kwargs = SCENARIOS[name]
    want = _train(model_name, "eager", accumulate, ddp_kwargs, rank)
    counter = CompileCounter("ember")
    got = _train(model_name, form, accumulate, ddp_kwargs, rank, counter)
    if counter.frame_count == 0:
        return "nothing was compiled"
    # the model's forward is one graph (no break inside it); accumulation may add a
    # recompile for the smaller batch
    if counter.op_count < 3 * counter.frame_count:
        return f"graphs hold few ops: {counter.frame_count} graphs, {counter.op_count} ops"
    for kind, w_list, g_list in (("parameter", want[0], got[0]), ("buffer", want[1], got[1])):
        for i, (w, g) in enumerate(zip(w_list, g_list)):
            if not torch.allclose(w, g, rtol=1e-4, atol=1e-5):
                return f"{kind} {i} differs by {(w - g).abs().max().item():.3g}"
    return None


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_on_ranks(_compare, SCENARIOS, str(tmp_path_factory.mktemp("ddp")))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ddp_trains_like_eager(results, name):
    for rank in range(WORLD):
        assert results[rank][name] is None, f"rank {rank}: {results[rank][name]}"
