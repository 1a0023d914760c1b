"""Where ``ember.frontend.ddp_split`` may cut a captured graph (one process, no DDP: the
plan is asked directly with each parameter's bytes and a bucket cap of one layer, so a cut
is wanted before every layer). The pieces, run in order by ``SplitGraph``, must compute what
the whole graph computes; no value but a tensor crosses a cut, nothing made before a cut is
written after it, no cut falls inside a ``no_grad`` block, and an autocast block open across
a cut is entered again. (Training under DDP: tests/distributed/test_ddp_split.py.)"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember
from ember.frontend import ddp_split

LAYER_BYTES = (8 * 8 + 8) * 4


class Layers(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.l1, self.l2, self.l3, self.l4 = (nn.Linear(8, 8) for _ in range(4))
        self.body = body

    def forward(self, x):
        return self.body(self, x)


def plain(m, x):
    return m.l4(torch.tanh(m.l3(torch.tanh(m.l2(torch.tanh(m.l1(x)))))))


def tuple_across(m, x):
    parts = m.l1(x).chunk(2, dim=-1)      # the tuple is read again after l3 (capture reads
    #                                       both items at once, so only tensors cross)
    y = m.l3(m.l2(torch.cat([parts[0], parts[0]], -1)))
    return m.l4(y + torch.cat([parts[1], parts[1]], -1))


def written_after(m, x):
    a = m.l1(x)
    b = m.l2(a)
    a.mul_(2)                                    # a, made before l2, written after it
    return m.l4(m.l3(b) + a)


def no_grad_block(m, x):
    a = m.l1(x)
    with torch.no_grad():
        b = m.l3(m.l2(a))
    return m.l4(a + b)


def autocast_block(m, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m.l3(m.l2(m.l1(x)))
    return m.l4(y.float())


def _capture(body):
    torch.manual_seed(0)
    model = Layers(body)
    seen = []

    def record(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward
    ember.compile(model, backend=record)(torch.randn(3, 8))
    (gm, example_inputs), = seen
    param_bytes = {id(p): LAYER_BYTES // 2 for p in model.parameters()}   # weight + bias
    return gm, example_inputs, param_bytes


def _crossing_ok(pieces):
    """Every value made by a piece and read by a later one is a tensor never written later."""
    for k, piece in enumerate(pieces):
        later = [n for p in pieces[k + 1:] for n in p.nodes]
        written = {ddp_split._base(w) for n in later for w in ddp_split._mutated(n)}
        for node in piece.nodes:
            if node.target is torch.amp.autocast_mode._enter_autocast:
                continue     # entered again by the later piece
            if any(node in user_piece_nodes for user_piece_nodes in
                   [set(n.all_input_nodes) for n in later]):
                assert isinstance(node.meta.get("val"), torch.Tensor), node
                assert ddp_split._base(node) not in written, node


@pytest.mark.parametrize("body, pieces", [(plain, 4), (tuple_across, 4), (written_after, 3),
                                          (no_grad_block, 3), (autocast_block, 4)])
def test_pieces_compute_the_whole_graph(body, pieces):
    gm, example_inputs, param_bytes = _capture(body)
    plan, why = ddp_split.plan(gm, example_inputs, param_bytes, [LAYER_BYTES], grad_mode=True)
    assert len(plan) == pieces, why
    _crossing_ok(plan)
    split = ddp_split.SplitGraph(gm, plan, lambda piece, inputs: piece.forward)
    with torch.no_grad():
        want, got = gm(*example_inputs), split(*example_inputs)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert torch.get_autocast_dtype("cpu") is not None and not torch.is_autocast_enabled("cpu")


def test_autocast_is_entered_again_by_each_piece():
    gm, example_inputs, param_bytes = _capture(autocast_block)
    plan, _ = ddp_split.plan(gm, example_inputs, param_bytes, [LAYER_BYTES], grad_mode=True)
    ddp_split.SplitGraph(gm, plan, lambda piece, inputs: piece.forward)
    for piece in plan[1:-1]:     # the pieces inside the block open and close it
        targets = [n.target for n in piece.gm.graph.nodes if n.op == "call_function"]
        assert targets[0] is torch.amp.autocast_mode._enter_autocast
        assert targets[-1] is torch.amp.autocast_mode._exit_autocast


def test_not_cut_when_every_parameter_fits_one_bucket():
    gm, example_inputs, param_bytes = _capture(plain)
    plan, why = ddp_split.plan(gm, example_inputs, param_bytes, [10 * LAYER_BYTES],
                              grad_mode=True)
    assert len(plan) == 1 and "fit one bucket" in why


def test_no_cut_where_a_tuple_would_cross():
    gm, _, _ = _capture(tuple_across)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert not ddp_split._cut_allowed({nodes["chunk"]}, set())
    assert ddp_split._cut_allowed({nodes["getitem"], nodes["linear"]}, set())
    assert not ddp_split._cut_allowed({nodes["getitem"]}, {nodes["linear"]})   # a view of it
