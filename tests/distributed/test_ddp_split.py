"""Graphs captured for DistributedDataParallel are cut at its gradient buckets (issue 33):
gloo on 2 CPU processes, a bucket cap small enough that the models span several buckets.

- Training: 3 SGD steps with the graph cut (and, as the control, not cut) give eager DDP's
  parameters and buffers, for both forms (``ember.compile(ddp)``, ``DDP(ember.compile(m))``),
  under ``no_sync()``, with ``find_unused_parameters`` and ``static_graph``.
- Pieces: a stack of six equal linear layers with a cap of two layers' bytes is cut into
  three pieces, as many as DDP's (rebuilt) buckets, and ``EMBER_LOGS=ddp`` says where; with
  ``config.split_ddp_graphs`` off nothing is cut or logged.
- Overlap: a comm hook records when each bucket's all-reduce is launched, and a hook on the
  autograd node that computes the first layer's gradient records when the backward reaches
  it; with the graph cut, a bucket is launched before that, and without the cut none is.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from ranks import WORLD, requires_gloo, run_on_ranks, wrap
from test_ddp import SmallCNN, TinyTransformer, TransformerWithSpare

pytestmark = requires_gloo

STEPS = 3
LAYER_BYTES = (16 * 16 + 16) * 4  # one Linear(16, 16)
# DDP's bucket cap (bytes) per model: a transformer block spans about two buckets, each conv
# one, the stack's buckets hold two layers each
CAPS = {"transformer": 4096, "spare": 4096, "cnn": 512, "stack": 2 * LAYER_BYTES}


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


MODELS = {"transformer": TinyTransformer, "spare": TransformerWithSpare, "cnn": SmallCNN,
          "stack": Stack}
INPUTS = {"transformer": (4, 6, 16), "spare": (4, 6, 16), "cnn": (4, 3, 8, 8), "stack": (4, 16)}

# name -> (model, form, cut the graph, no_sync accumulation, DDP keyword arguments)
SCENARIOS = {
    "transformer-compiled_ddp": ("transformer", "compiled_ddp", True, False, {}),
    "transformer-compiled_ddp-uncut": ("transformer", "compiled_ddp", False, False, {}),
    "transformer-ddp_of_compiled": ("transformer", "ddp_of_compiled", True, False, {}),
    "transformer-compiled_ddp-no_sync": ("transformer", "compiled_ddp", True, True, {}),
    "transformer-ddp_of_compiled-static_graph": ("transformer", "ddp_of_compiled", True,
                                                 False, {"static_graph": True}),
    "cnn-compiled_ddp": ("cnn", "compiled_ddp", True, False, {}),
    "spare-compiled_ddp-find_unused": ("spare", "compiled_ddp", True, False,
                                       {"find_unused_parameters": True}),
    "spare-ddp_of_compiled-find_unused-no_sync": ("spare", "ddp_of_compiled", True, True,
                                                  {"find_unused_parameters": True}),
    "transformer-compiled_ddp-autocast": ("transformer", "compiled_ddp", True, False, {}),
    "stack-compiled_ddp": ("stack", "compiled_ddp", True, False, {}),
    "stack-compiled_ddp-uncut": ("stack", "compiled_ddp", False, False, {}),
    # a frame that runs eagerly (ember.compile(EagerWrapper(ddp))) compiles the DDP it calls
    "stack-compiled_wrapper": ("stack", "compiled_wrapper", True, False, {}),
}
# trained under torch.autocast("cpu", dtype=torch.bfloat16) around the call: each piece
# enters the block again (eager's own bfloat16 rounding differs, hence a wider tolerance)
AUTOCAST = {"transformer-compiled_ddp-autocast"}


def _first_layer_weight(model):
    return next(model.parameters())


def _node_computing(loss, param):
    """The autograd node whose output is ``param``'s gradient."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for fn, _ in node.next_functions:
            if fn is not None and getattr(fn, "variable", None) is param:
                return node
            todo.append(fn)
    raise AssertionError("no autograd node computes the parameter's gradient")


def _train(model_name, form, cut, accumulate, ddp_kwargs, rank, counter=None,
           autocast=False):
    """(parameters, buffers, events of the last step's backward) after STEPS SGD steps."""
    from ember import config
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    torch.manual_seed(0)
    model = MODELS[model_name]()
    ddp_kwargs = {"bucket_cap_mb": CAPS[model_name] / 2 ** 20, **ddp_kwargs}
    run, ddp = wrap(model, form, ddp_kwargs, counter)
    events = []

    def record_bucket(state, bucket):
        events.append(f"bucket {bucket.index()}")
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, record_bucket)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with config.patch(split_ddp_graphs=cut):
        for step in range(STEPS):
            g = torch.Generator().manual_seed(100 * rank + step)
            x = torch.randn(INPUTS[model_name], generator=g)
            if accumulate:      # half the batch without syncing, the other half syncs
                with run.no_sync():
                    run(x[:2]).square().mean().backward()
                x = x[2:]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = run(x).float().square().mean()
            events.clear()
            _node_computing(loss, _first_layer_weight(model)).register_hook(
                lambda grad_inputs, grad_outputs: events.append("first layer"))
            loss.backward()
            opt.step()
            opt.zero_grad()
    return ([p.detach().clone() for p in model.parameters()],
            [b.clone() for b in model.buffers()], events)


def _compare(name, rank):
    from ember.testing import CompileCounter
    model_name, form, cut, accumulate, ddp_kwargs = SCENARIOS[name]
    autocast = name in AUTOCAST
    want = _train(model_name, "eager", cut, accumulate, ddp_kwargs, rank, autocast=autocast)
    counter = CompileCounter("ember")
    with _ddp_log() as log:
        got = _train(model_name, form, cut, accumulate, ddp_kwargs, rank, counter, autocast)
    tol = 1e-2 if autocast else 1e-5
    for kind, w_list, g_list in (("parameter", want[0], got[0]), ("buffer", want[1], got[1])):
        for i, (w, g) in enumerate(zip(w_list, g_list)):
            if not torch.allclose(w, g, rtol=10 * tol, atol=tol):
                return f"{kind} {i} differs by {(w - g).abs().max().item():.3g}"
    # the model's forward is one captured graph: each compile is one piece of it
    return {"pieces": counter.frame_count, "events": got[2], "eager_events": want[2],
            "log": log}


@contextlib.contextmanager
def _ddp_log():
    """The messages of EMBER_LOGS=ddp while the block runs."""
    from ember import logs
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("ember.ddp")
    logs.set_logs("ddp")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logs.set_logs("")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_on_ranks(_compare, SCENARIOS, str(tmp_path_factory.mktemp("ddp_split")))


def _result(results, name):
    for rank in range(WORLD):
        assert isinstance(results[rank][name], dict), f"rank {rank}: {results[rank][name]}"
    return results[0][name]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_cut_graph_trains_like_eager(results, name):
    result = _result(results, name)
    cut = SCENARIOS[name][2]
    if cut:       # (pieces and buckets need not match one to one: DDP may cut between
        assert result["pieces"] > 1, result    # a weight and its bias, the graph cannot)
    else:
        assert result["pieces"] == 1, result


@pytest.mark.parametrize("name", ["stack-compiled_ddp", "stack-compiled_wrapper"])
def test_pieces_follow_ddp_buckets(results, name):
    result = _result(results, name)
    assert result["pieces"] == 3
    assert any("split into 3 pieces at DDP bucket boundaries: 12 parameters, 6.38 KiB, "
               "bucket caps 2.12 KiB; cut before 'linear_2', 'linear_4'" in m
               for m in result["log"]), result["log"]
    buckets = {e for e in result["eager_events"] if e.startswith("bucket")}
    assert len(buckets) == result["pieces"]


@pytest.mark.parametrize("name", ["stack-compiled_ddp", "transformer-compiled_ddp",
                                  "transformer-ddp_of_compiled", "cnn-compiled_ddp"])
def test_bucket_all_reduce_starts_before_backward_reaches_first_layer(results, name):
    events = _result(results, name)["events"]
    assert "first layer" in events, events
    assert events[0].startswith("bucket"), events


def test_option_off_does_not_cut(results):
    assert not _result(results, "stack-compiled_ddp-uncut")["log"]


def test_uncut_graph_launches_every_bucket_after_its_backward(results):
    """The control: one autograd node, every bucket after the whole backward."""
    for name in ("stack-compiled_ddp-uncut", "transformer-compiled_ddp-uncut"):
        events = _result(results, name)["events"]
        assert events[0] == "first layer", (name, events)


def test_option_is_checked():
    from ember import config
    with pytest.raises(TypeError, match="split_ddp_graphs"):
        config.patch(split_ddp_graphs="off")
    env = {**os.environ, "EMBER_SPLIT_DDP_GRAPHS": "sometimes"}
    proc = subprocess.run([sys.executable, "-c", "import ember"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "EMBER_SPLIT_DDP_GRAPHS='sometimes'" in proc.stderr
