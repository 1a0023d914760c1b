"""Splitting a captured graph at DistributedDataParallel's gradient-bucket boundaries.

Why: DDP all-reduces gradients in buckets; hooks on the parameters launch a bucket's
all-reduce once autograd has written all its gradients. A graph compiled as one autograd node
hands out every gradient at the end of its backward, so every all-reduce waits for the whole
backward. Cut into consecutive pieces, each compiled on its own (its own autograd node), the
last piece's backward finishes first, its parameters' gradients are written and their bucket's
all-reduce starts while the earlier pieces' backward still runs. (torch.compile calls its
version of this "DDPOptimizer".) ``config.split_ddp_graphs`` turns it off;
``EMBER_LOGS=ddp`` says where each graph was cut and why.

Decisions
---------
* **Which DDP.** A graph is split when it was captured for a DDP: one whose forward Ember
  captured (``ember.compile(ddp)``: the compile wrapper knows its DDP; a frame that inlines
  ``DDP.forward``: capture records the DDP when it enters ``_inside_ddp_forward``), or one
  running its forward when the graph is compiled (``DDP(ember.compile(model))``: DDP marks
  itself active around its module's call, ``DDP._get_active_ddp_module()``).
* **The bucket model.** After its first iteration DDP rebuilds its buckets in the order the
  gradients became ready, closing a bucket once it holds at least its cap (the first bucket's
  cap, ``first_bucket_bytes_cap``, then ``bucket_bytes_cap``; or the user's per-bucket list).
  A parameter's gradient is complete once the backward has passed its *first* use in the
  forward (a tied weight used again at the end is ready only then), so the walk goes from
  the graph's end to its start, counts each parameter DDP reduces (requires grad, not in
  ``parameters_to_ignore``; buffers are plain inputs) at the node of its first use, and cuts
  before the node where the piece reaches its bucket's cap. The earliest piece takes what is
  left; a cut that would leave it no parameter is not made.
* **Where a cut may go.** Only where (a) every value crossing it is a tensor (not a tuple, not
  a size), (b) no node after it mutates a value made before it, other than a graph input, nor
  a view of such a value, (c) grad mode is as at the graph's start and no inference-mode
  block is open. An autocast block open across a cut (``torch.autocast`` in the forward, or
  around the call: the graph then starts by entering it) is exited at the end of the piece
  before the cut and entered again at the start of the next. A wanted cut that is not
  allowed moves earlier to the first place that is.
* **Compiled on first call.** A piece's inputs are earlier pieces' outputs, whose real values
  (strides, ``requires_grad``) exist only when the graph runs; each piece is handed to the
  backend on its first call with the values it gets. Graph inputs are guarded by the frame,
  and each piece is deterministic, so later calls see the same kinds of values. A graph with
  symbolic sizes is not split: its pieces would have to be compiled when it is captured
  (a backend may add shape guards, which the frame's entry collects then), before the real
  values that cross a cut exist, and the backend compiles for its inputs' strides. A graph
  run without grad (no backward) and a DDP that all-reduces after the whole backward
  (``delay_all_reduce_named_params``) are not split either; the log says why.
"""
from __future__ import annotations

import operator
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from ember import config, logs

_MiB = 1024 * 1024


def _ddp_class():
    if not torch.distributed.is_available():
        return None
    return torch.nn.parallel.DistributedDataParallel


def is_ddp(obj) -> bool:
    cls = _ddp_class()
    return cls is not None and isinstance(obj, cls)


def active_ddp():
    """The DDP whose forward is running now, or None."""
    cls = _ddp_class()
    return None if cls is None else cls._get_active_ddp_module()


def bucket_caps(ddp) -> list[int]:
    """The byte caps of DDP's buckets as it rebuilds them, in gradient-ready order; the last
    one repeats."""
    config_ = getattr(ddp, "_bucket_config", None)
    if config_ is not None:
        if config_.per_bucket_bytes_caps:
            return list(config_.per_bucket_bytes_caps)
        return [config_.first_bucket_bytes_cap, config_.bucket_bytes_cap]
    # torch before _BucketCapacityConfig: a small first bucket only with the default cap
    first = (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
             if getattr(ddp, "bucket_bytes_cap_default", False) else ddp.bucket_bytes_cap)
    return [first, ddp.bucket_bytes_cap]


def reduced_parameters(ddp) -> dict[int, int]:
    """id -> bytes of each parameter whose gradient DDP all-reduces."""
    ignored = getattr(ddp, "parameters_to_ignore", set())
    return {id(p): p.numel() * p.element_size()
            for name, p in ddp.module.named_parameters()
            if p.requires_grad and name not in ignored}


# ---- where a cut may go -------------------------------------------------------------------

# methods/functions whose result may share storage with their first argument
_VIEWS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "swapaxes", "swapdims", "permute",
    "t", "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten", "narrow",
    "select", "getitem", "__getitem__", "chunk", "split", "split_with_sizes", "tensor_split",
    "unbind", "as_strided", "detach", "movedim", "moveaxis", "diagonal", "unfold",
    "contiguous", "real", "imag", "view_as_real", "view_as_complex", "alias", "hsplit",
    "vsplit", "dsplit", "T", "mT", "H", "mH"})
_INPLACE_NAMES = frozenset({"copy_", "__setitem__", "setitem", "set_", "resize_"})
_ENTER_AUTOCAST = torch.amp.autocast_mode._enter_autocast
_EXIT_AUTOCAST = torch.amp.autocast_mode._exit_autocast
_ENTER_INFERENCE = torch.autograd.grad_mode._enter_inference_mode
_EXIT_INFERENCE = torch.autograd.grad_mode._exit_inference_mode


def _name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return node.target
    return getattr(node.target, "__name__", "")


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The value ``node`` may be a view of, following view-making calls back."""
    while node.op in ("call_method", "call_function") and _name(node) in _VIEWS and \
            node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _mutated(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The values ``node`` may write to."""
    if node.op == "call_module":
        return list(node.all_input_nodes)
    written = []
    name = _name(node)
    first = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
    in_place = (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_NAMES or \
        (node.target in _OPERATOR_INPLACE) or node.kwargs.get("inplace") is True
    if in_place and first is not None:
        written.append(first)
    out = node.kwargs.get("out")
    for value in (out if isinstance(out, (tuple, list)) else (out,)):
        if isinstance(value, torch.fx.Node):
            written.append(value)
    return written


_OPERATOR_INPLACE = frozenset(
    getattr(operator, n) for n in dir(operator)
    if n.startswith("i") and n[1:] in dir(operator) and callable(getattr(operator, n)))


def _global_state(nodes: list[torch.fx.Node], start_mode: bool
                  ) -> tuple[list[bool], list[tuple]]:
    """Before each node i (and after the last): whether grad mode is as at the start and no
    inference-mode block is open, and the autocast blocks open (their enter nodes, outermost
    first: a piece that starts inside one enters it again, one that ends inside exits it)."""
    mode, inference, autocast = start_mode, 0, ()
    ok, open_autocast = [], []
    for node in nodes:
        ok.append(mode == start_mode and inference == 0)
        open_autocast.append(autocast)
        if node.op != "call_function":
            continue
        if node.target is torch._C._set_grad_enabled:
            mode = bool(node.args[0])
        elif node.target is _ENTER_INFERENCE:
            inference += 1
        elif node.target is _EXIT_INFERENCE:
            inference -= 1
        elif node.target is _ENTER_AUTOCAST:
            autocast += (node,)
        elif node.target is _EXIT_AUTOCAST:
            autocast = tuple(n for n in autocast if n is not node.args[0])
    open_autocast.append(autocast)
    return ok, open_autocast


# ---- the plan -----------------------------------------------------------------------------

@dataclass
class Piece:
    nodes: list[torch.fx.Node]
    params: int = 0           # parameters whose gradient completes in this piece
    nbytes: int = 0
    inputs: list[int] = field(default_factory=list)     # slots read
    outputs: list[int] = field(default_factory=list)    # slots written
    frees: list[int] = field(default_factory=list)      # slots read for the last time
    reentered: tuple = ()     # autocast enter nodes open at its start / end
    left_open: tuple = ()
    gm: torch.fx.GraphModule | None = None
    compiled: Callable | None = None


def plan(gm: torch.fx.GraphModule, example_inputs: list, param_bytes: dict[int, int],
         caps: list[int], *, grad_mode: bool) -> tuple[list[Piece], str]:
    """The pieces ``gm`` is cut into (one: not cut) and why, as a sentence for the log;
    ``grad_mode``: the grad mode the graph starts in."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    bytes_of: dict[torch.fx.Node, int] = {}
    for node, value in zip(placeholders, example_inputs):
        if isinstance(value, torch.Tensor) and id(value) in param_bytes:
            bytes_of[node] = param_bytes[id(value)]
    completes = [0] * len(nodes)       # bytes whose gradient is complete below node i
    counts = [0] * len(nodes)
    seen: set[torch.fx.Node] = set()
    for i, node in enumerate(nodes):
        for inp in node.all_input_nodes:
            if inp in bytes_of and inp not in seen:
                seen.add(inp)
                completes[i] += bytes_of[inp]
                counts[i] += 1
    if not seen:
        return [Piece(nodes)], "it uses no parameter DDP reduces"
    state_ok, open_autocast = _global_state(nodes, grad_mode)
    first_param_at = next(i for i, c in enumerate(counts) if c)
    live = set(output.all_input_nodes)
    written: set[torch.fx.Node] = set()      # bases of values written at or after i
    cuts: list[int] = []
    filled, bucket, wanted = 0, 0, False
    for i in range(len(nodes) - 1, 0, -1):
        node = nodes[i]
        live.discard(node)
        live.update(node.all_input_nodes)
        written.update(_base(w) for w in _mutated(node))
        filled += completes[i]
        if filled >= caps[min(bucket, len(caps) - 1)]:
            wanted = True
        if wanted and i > first_param_at and state_ok[i] and _cut_allowed(live, written):
            cuts.append(i)
            bucket += 1
            filled, wanted = 0, False
    if not cuts:
        return [Piece(nodes)], (f"{len(seen)} parameters, {_mib(sum(bytes_of.values()))}, fit "
                                f"one bucket (cap {_mib(caps[0])})")
    bounds = [0, *reversed(cuts), len(nodes)]
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        pieces.append(Piece(nodes[lo:hi], sum(counts[lo:hi]), sum(completes[lo:hi]),
                            reentered=open_autocast[lo], left_open=open_autocast[hi]))
    return pieces, _describe(pieces, caps, len(seen), sum(bytes_of.values()))


def _cut_allowed(live: set, written: set) -> bool:
    for node in live:
        if node.op == "placeholder" or node.target is _ENTER_AUTOCAST:
            continue      # (an autocast block open across the cut is entered again)
        if not isinstance(node.meta.get("val"), torch.Tensor):
            return False      # a tuple, a size, a Python value
        if _base(node) in written:
            return False
    return True


def _mib(n: int) -> str:
    """A byte count in B, KiB or MiB."""
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.3g} KiB" if n < _MiB else f"{n / _MiB:.3g} MiB"


def _describe(pieces: list[Piece], caps: list[int], count: int, total: int) -> str:
    cap_text = _mib(caps[0]) if len(set(caps)) == 1 else \
        f"{_mib(caps[0])} first, then {', '.join(_mib(c) for c in caps[1:])}"
    parts = [f"piece {k}: {len(p.nodes)} nodes from {p.nodes[0].name!r}, {p.params} "
             f"parameters, {_mib(p.nbytes)}" for k, p in enumerate(pieces)]
    return (f"{count} parameters, {_mib(total)}, bucket caps {cap_text}; cut before "
            f"{', '.join(repr(p.nodes[0].name) for p in pieces[1:])}; " + "; ".join(parts))


# ---- the pieces as graphs, and running them -----------------------------------------------

def _build(gm: torch.fx.GraphModule, pieces: list[Piece]) -> tuple[int, list]:
    """Give each piece its graph and slots; returns the slot count and the output's slots."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    slot = {n: i for i, n in enumerate(placeholders)}
    used_after: dict[torch.fx.Node, int] = {}     # node -> last piece (len: the output) reading it
    for k, piece in enumerate(pieces):
        for node in piece.nodes:
            for inp in node.all_input_nodes:
                used_after[inp] = k
    for inp in output.all_input_nodes:
        used_after[inp] = len(pieces)
    next_slot = len(placeholders)
    for k, piece in enumerate(pieces):
        graph = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        members = set(piece.nodes)
        for enter in piece.reentered:
            env[enter] = graph.node_copy(enter)
        for node in piece.nodes:
            for inp in node.all_input_nodes:
                if inp not in members and inp not in env:
                    env[inp] = graph.placeholder(inp.name)
                    env[inp].meta = dict(inp.meta)
                    piece.inputs.append(slot[inp])
                    if used_after[inp] == k and inp.op != "placeholder":
                        piece.frees.append(slot[inp])
            env[node] = graph.node_copy(node, lambda n: env[n])
        outs = [n for n in piece.nodes
                if used_after.get(n, -1) > k and n.target is not _ENTER_AUTOCAST]
        for node in outs:
            slot[node] = next_slot
            piece.outputs.append(next_slot)
            next_slot += 1
        for enter in reversed(piece.left_open):
            graph.call_function(_EXIT_AUTOCAST, (env[enter],))
        graph.output(tuple(env[n] for n in outs))
        piece.gm = torch.fx.GraphModule(gm, graph, class_name=f"{type(gm).__name__}_piece{k}")
    out_spec = [slot[a] if isinstance(a, torch.fx.Node) else ("const", a)
                for a in output.args[0]]
    return next_slot, out_spec


class SplitGraph:
    """Runs the pieces in order, compiling each on its first call (see the module
    docstring); called like the whole graph's compiled function."""

    def __init__(self, gm: torch.fx.GraphModule, pieces: list[Piece], compile_fn: Callable):
        self.pieces = pieces
        self.slots, self.out_spec = _build(gm, pieces)
        self.compile_fn = compile_fn
        self._lock = threading.Lock()

    def _compiled(self, piece: Piece, args: list) -> Callable:
        with self._lock:
            if piece.compiled is None:
                compiled = self.compile_fn(piece.gm, args)
                if not callable(compiled):
                    raise TypeError(f"backend returned {type(compiled).__name__}, not a "
                                    f"callable")
                piece.compiled = compiled
            return piece.compiled

    def __call__(self, *args):
        values: list[Any] = list(args) + [None] * (self.slots - len(args))
        for piece in self.pieces:
            inputs = [values[s] for s in piece.inputs]
            run = piece.compiled or self._compiled(piece, inputs)
            outs = run(*inputs)
            del inputs
            for s, v in zip(piece.outputs, outs):
                values[s] = v
            for s in piece.frees:
                values[s] = None
        return tuple(values[s] if isinstance(s, int) else s[1] for s in self.out_spec)


def compile_for_ddp(gm: torch.fx.GraphModule, example_inputs: list, compile_fn: Callable,
                    ddp, where: str, grad_mode: bool) -> Callable:
    """``gm`` compiled by ``compile_fn(gm, example_inputs)``, cut at ``ddp``'s bucket
    boundaries when ``config.split_ddp_graphs`` is on (``where`` names the frame for the
    log; ``grad_mode``: the one the graph starts in)."""
    if not config.split_ddp_graphs:
        return compile_fn(gm, example_inputs)
    pieces, why = [], _why_not_cut(example_inputs, ddp, grad_mode)
    if why is None:
        pieces, why = plan(gm, example_inputs, reduced_parameters(ddp), bucket_caps(ddp),
                           grad_mode=grad_mode)
    if len(pieces) < 2:
        logs.log("ddp", "graph of %s not split at DDP bucket boundaries: %s", where, why)
        return compile_fn(gm, example_inputs)
    logs.log("ddp", "graph of %s split into %d pieces at DDP bucket boundaries: %s", where,
             len(pieces), why)
    return SplitGraph(gm, pieces, compile_fn)


def _why_not_cut(example_inputs: list, ddp, grad_mode: bool) -> str | None:
    if not grad_mode:
        return "it runs without grad (no backward to overlap)"
    if getattr(ddp, "_delay_all_reduce_all_params", False):
        return ("the DDP all-reduces every gradient after the backward "
                "(delay_all_reduce_named_params)")
    # (every size symbol of a captured graph is a placeholder of its own)
    if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in example_inputs):
        return "it has symbolic sizes"
    return None
