"""GraphLowering: runs an ATen-level FX graph over IR nodes, producing buffers.

Each node is lowered by its registered lowering (``lowering/``) or, when it has none, becomes
an ATen call in the wrapper (a fallback). Bodies stay unrealized (inlined into their
consumers) unless they are read by several consumers and costly to recompute, read by an
ATen call, reduced, or returned; realized bodies become ComputedBuffers, which the scheduler
groups into kernels.
"""
from __future__ import annotations

import operator
import re
from typing import Any

import sympy
import torch
import torch.fx

from ember import logs
from ember.backend import compile_stats, sizevars
from ember.backend.ir import (Buffer, ComputedBuffer, ExternBuffer, IndexView, InputBuffer,
                              IRNode, Layout, Pointwise, Reduction, ReinterpretView,
                              SizeInput, contiguous_strides, index_vars, same_strides, sym)
from ember.backend.lowering import LOWERINGS
from ember.backend.lowering.cost import LIBRARY_OPS, body_cost
from ember.backend.lowering.registry import LoweringContext
from ember.backend.lowering.views import clone_layout, storage_owner, strided_view
from ember.backend.ops import use_handler
from ember.backend.passes.fx_utils import node_tensors
from ember.fake import returns_alias

aten_copy, aten_fill = torch.ops.aten.copy_.default, torch.ops.aten.fill_.Scalar
# ops that address their first argument's storage (sizes, strides and offset traced against
# eager's layout of it), not its elements in logical order: their ATen kernels get that
# storage in eager's layout (``strided_view``), never Ember's memory as it happens to be
STORAGE_VIEWS = {torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default,
                 torch.ops.aten._reshape_alias.default, torch.ops.aten._reshape_alias_copy.default}

# library matmuls, which read an operand transposed in its last two dims as it is
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
            torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default}


class GraphLowering:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, target,
                 device: torch.device = torch.device("cpu"), fused_random: bool = False):
        self.gm = gm
        self.target = target     # which dtypes kernels compute, the device's policies
        self.device = device                    # kernels read tensors on this device only
        self.example_inputs = example_inputs
        self.buffers: list[Buffer] = []          # ComputedBuffer / ExternBuffer, in order
        self._itemsizes: dict[str, int] = {}     # buffer name -> bytes per element
        self._itemsizes_seen = 0                 # of self.buffers, those in _itemsizes
        self.inputs: list[InputBuffer] = []      # graph inputs, placeholder order
        self.constants: dict[str, torch.Tensor] = {}
        self.constant_buffers: list[InputBuffer] = []   # their buffers, read like inputs
        self.outputs: list[Any] = []
        # id(node) -> (buffer, node); holding the node keeps its id from being reused by a
        # later, different node (which would then be "realized" as the wrong buffer)
        self._realized: dict[int, tuple] = {}
        self._realized_as: dict[tuple, tuple] = {}   # (id(node), strides, offset, dtype) -> same
        self._eager_vals: dict[int, tuple] = {}   # id(IR value) -> (value, fake of its node)
        self.reductions: dict[tuple, tuple] = {}   # reductions already made, for reuse
        self.padded_operands: dict[tuple, tuple] = {}   # matmul operands' padded copies
        self.input_copies: list[tuple] = []        # (graph input, new value), see below
        self.fused_random = fused_random   # Philox draws in kernels; else eager's random ops
        self.random_seed: ExternBuffer | None = None   # drawn once per call (lowering/random.py)
        self.random_offset = 0                     # Philox offsets taken by random ops so far
        self._count = 0
        self.env: dict[torch.fx.Node, Any] = {}
        # id(IR value) -> (value, the FX nodes whose ops its body inlines): what a kernel
        # computing it computes (``Buffer.origins``, which kernel names say)
        self._origins: dict[int, tuple] = {}
        self._node: torch.fx.Node | None = None     # the node being lowered
        self._lowering: frozenset = frozenset()      # it and the nodes its inputs inline
        self._order: dict[torch.fx.Node, int] = {}   # node -> its position in the graph

    # -- names -------------------------------------------------------------------------------
    def new_name(self, prefix="buf") -> str:
        name = f"{prefix}{self._count}"
        self._count += 1
        return name

    # -- realization ---------------------------------------------------------------------------
    def realize(self, node: IRNode, layout: Layout | None = None) -> Buffer:
        if isinstance(node, Buffer) and layout is None:
            return node
        key = id(node)
        if layout is None and key in self._realized:
            return self._realized[key][0]
        size = node.get_size()
        memo = layout is None
        if layout is None:
            layout = self.preferred_layout(node) or Layout(
                node.get_device(), node.get_dtype(), size, contiguous_strides(size))
        # the same value in the same layout is one buffer, whoever asks (GPT-2's KV-cache
        # value is both attention's input and a graph output)
        shape = (key, tuple(layout.stride), layout.offset, layout.dtype)
        known = self._realized_as.get(shape)
        if known is not None:
            if memo:
                self._realized[key] = known
            return known[0]
        data = node if isinstance(node, Reduction) else \
            Pointwise(node.get_device(), node.get_dtype(), node.make_loader(), size)
        buf = ComputedBuffer(self.new_name(), layout, data)
        if not isinstance(node, (Buffer, ReinterpretView)):    # (else a copy of memory)
            buf.origins = self._ops(self._origins.get(id(node), (None, self._lowering))[1])
        self.buffers.append(buf)
        if memo:
            self._realized[key] = (buf, node)
        self._realized_as[shape] = (buf, node)
        return buf

    # -- origins: the ops each buffer computes -----------------------------------------------
    def _inlined_origins(self, value) -> frozenset:
        """The FX nodes whose ops the bodies in ``value`` (an IR value, or lists, tuples and
        dicts of them) inline; memory inlines none."""
        if isinstance(value, (list, tuple, dict)):
            values = value.values() if isinstance(value, dict) else value
            return frozenset().union(*[self._inlined_origins(v) for v in values])
        if isinstance(value, IRNode) and not isinstance(value, (Buffer, ReinterpretView)):
            return self._origins.get(id(value), (None, frozenset()))[1]
        return frozenset()

    def _note_origins(self, value) -> None:
        """``value``, the node being lowered's result, computes its op and what it inlines."""
        if isinstance(value, (list, tuple)):
            for v in value:
                self._note_origins(v)
        elif isinstance(value, IRNode):
            self._origins[id(value)] = (value, self._lowering)

    def _ops(self, nodes) -> tuple:
        """The ATen ops of ``nodes`` in program order, each once (a decomposed op's nodes
        say the op they came from)."""
        ordered = sorted(nodes, key=lambda n: self._order.get(n, 0))
        return tuple(dict.fromkeys(n.meta.get("original_aten", n.target) for n in ordered))

    def preferred_layout(self, node: IRNode) -> Layout | None:
        """Eager's channels-last strides for a value whose op eager would give them (the
        pointwise work after a channels-last convolution): kept, so the graph does not
        convert back and forth."""
        val = self._eager_vals.get(id(node), (None, None))[1]
        if not isinstance(val, torch.Tensor) or val.dim() != 4 or \
                [sym(s) for s in val.shape] != list(node.get_size()) or \
                val.is_contiguous() or not val.is_contiguous(memory_format=torch.channels_last):
            return None
        return Layout(node.get_device(), node.get_dtype(), node.get_size(),
                      [sym(s) for s in val.stride()])

    def memory(self, node: IRNode) -> IRNode:
        """A node an ATen call can receive: a buffer or a view of one."""
        if isinstance(node, (Buffer, ReinterpretView)):
            return node
        return self.realize(node)

    # -- running the graph ---------------------------------------------------------------------
    def run(self) -> "GraphLowering":
        placeholders = iter(self.example_inputs)
        self._order = {node: i for i, node in enumerate(self.gm.graph.nodes)}
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                value = next(placeholders)
                if isinstance(value, torch.SymInt):     # a size: bound to its symbol's name
                    expr = value.node.expr
                    name = expr.name if isinstance(expr, sympy.Symbol) else \
                        self.new_name("_size")
                    self.inputs.append(SizeInput(name))
                    self.env[node] = expr
                    continue
                buf = InputBuffer(self.new_name("arg"), _base_layout(value))
                self.inputs.append(buf)
                self.env[node] = buf
            elif node.op == "get_attr":
                value = getattr(self.gm, node.target)
                buf = InputBuffer(self.new_name("const"), _base_layout(value))
                self.constants[buf.name] = value
                self.constant_buffers.append(buf)
                self.env[node] = buf
            elif node.op == "call_function":
                self.env[node] = self.lower_node(node)
            elif node.op == "output":
                self._node, self._lowering = None, frozenset()
                flat = self._flat(node.args[0])
                # outputs are computed before the inputs are overwritten: a lazy output
                # (``x + 1`` of an ``x`` mutated later) reads the old values, as in eager
                outputs = {n for n in flat if isinstance(n, torch.fx.Node)}
                self.outputs = [self.finish_output(self._arg(n), n, outputs) for n in flat]
                self.apply_input_copies()
            else:
                raise NotImplementedError(f"node kind {node.op}")
        return self

    @staticmethod
    def _flat(value):
        return list(value) if isinstance(value, (tuple, list)) else [value]

    def _arg(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, torch.SymInt):
            return a.node.expr
        if isinstance(a, torch.SymFloat):     # a float of sizes (``s ** 0.5``)
            expr = a.node.expr
            return float(expr) if expr.is_Number else expr
        if isinstance(a, torch.SymBool):
            raise NotImplementedError(f"a SymBool argument ({a})")
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return a

    def lower_node(self, node: torch.fx.Node):
        """Lower one call: its registered lowering, or its ATen kernel (a fallback).

        A lowering declines a case it does not handle by returning ``NotImplemented`` or
        raising ``NotImplementedError``: the op then runs its ATen kernel (a perf hint says
        why). Any other exception is a bug in the lowering: with
        ``config.fallback_on_lowering_error`` (the default) a warning names the op and the
        error and the op runs its ATen kernel; without it (the tests) it raises.
        """
        target = node.target
        args = [self._arg(a) for a in node.args]
        kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
        self._node, self._lowering = node, self._inlined_origins([args, kwargs]) | {node}
        if target is operator.getitem:    # an output of a multi-output lowering
            return self._share(args[0][args[1]], node)
        if target is torch.ops.aten.copy_.default:
            return self.defer_input_copy(args[0], args[1])
        lowering = LOWERINGS.get(target)
        result = NotImplemented
        if lowering is not None and self._supported(node):
            try:
                result = lowering(LoweringContext(self, node), *args, **kwargs)
            except NotImplementedError as e:
                logs.log("perf_hints", "lowering of %s declines (%s); running ATen", target, e)
                result = NotImplemented
            except Exception as e:
                if _needs_static_size(e):
                    # a lowering that needs a static size, met with a symbolic one
                    logs.log("perf_hints", "lowering of %s declines symbolic sizes (%s); "
                                           "running ATen", target, e)
                    return self.fallback(node, args, kwargs)
                from ember import config
                where = (f"{getattr(lowering, '__module__', '?')}."
                         f"{getattr(lowering, '__qualname__', lowering)}")
                if not config.fallback_on_lowering_error:
                    raise RuntimeError(
                        f"ember backend: the lowering of {target} ({where}) raised "
                        f"{type(e).__name__}: {e}") from e
                logs.warn("ember backend: the lowering of %s (%s) raised %s: %s (a bug in "
                          "the lowering); running its ATen kernel instead",
                          target, where, type(e).__name__, e)
                result = NotImplemented
            else:   # a library op's own kernel is the usual case, not worth a hint
                if result is NotImplemented and target not in LIBRARY_OPS:
                    logs.log("perf_hints", "lowering of %s declines this case; running ATen",
                             target)
        if result is NotImplemented:
            return self.fallback(node, args, kwargs)
        val = node.meta.get("val")
        if isinstance(result, IRNode) and not isinstance(result, Buffer):
            self._eager_vals[id(result)] = (result, val)
        elif isinstance(result, (tuple, list)) and isinstance(val, (tuple, list)):
            for item, item_val in zip(result, val):     # max_pool2d_with_indices and kin
                if isinstance(item, IRNode) and not isinstance(item, Buffer):
                    self._eager_vals[id(item)] = (item, item_val)
        self._note_origins(result)
        return self._share(result, node)

    def _share(self, result, node: torch.fx.Node):
        """A body read by several consumers is computed once when recomputing it costs."""
        return self.computed_once(result, len(node.users))

    def computed_once(self, value, reads: float):
        """``value`` realized when each of its elements is read ``reads`` times (several
        consumers, or one pooling window that overlaps the next) and recomputing it for the
        extra reads costs more ops than the target's ``recompute_limit`` (ops x extra reads:
        Llama's rotary cos and sin, read by every layer, were recomputed in each, libm calls
        included), or when it loads several values per element that are not broadcast
        (``BodyCost.full_load_names``) and its readers would move more bytes reloading them
        than storing it and loading it back: a float32 residual sum read by the next layer
        and by its norm is stored once (inlined, each layer's norm re-read every earlier
        layer's output: ViT, GPT-2). A value of one such load is never stored for it (layer
        norm's ``(x - mean) * rstd``, recomputed by its backward's column sums), nor one
        computed in float32 from two bf16 values (GPT-2's GELU backward under autocast)."""
        if not isinstance(value, (Pointwise, IndexView)) or reads <= 1:
            return value
        cost = body_cost(value)
        if cost.ops * (reads - 1) > self.target.recompute_limit:
            return self.realize(value)
        names = cost.full_load_names()
        if len(names) > 1:
            loaded = sum(self._itemsize(name) for name in names)
            # (a gather's loads land anywhere: reloading them costs more than their bytes)
            if cost.indirect or reads * loaded > (reads + 1) * value.get_dtype().itemsize:
                return self.realize(value)
        return value

    def _itemsize(self, name: str) -> int:
        """Bytes per element of the buffer, input or constant called ``name`` (the buffers
        made since the last miss are added then: each is looked at once)."""
        if name not in self._itemsizes:
            seen = self._itemsizes_seen
            for buf in (*self.inputs, *self.constant_buffers, *self.buffers[seen:]):
                if buf.layout is not None:
                    self._itemsizes[buf.name] = buf.layout.dtype.itemsize
            self._itemsizes_seen = len(self.buffers)
        return self._itemsizes.get(name, 4)

    def _supported(self, node: torch.fx.Node) -> bool:
        return all(t.dtype in self.target.dtypes and t.device == self.device
                   for t in node_tensors(node))

    def fallback(self, node: torch.fx.Node, args, kwargs):
        """Run the op's ATen kernel from the wrapper; its outputs become ExternBuffers."""
        is_library = node.target in LIBRARY_OPS
        counter = compile_stats.extern_calls if is_library else compile_stats.fallback_ops
        counter[str(node.target)] += 1
        if isinstance(args[0] if args else None, IRNode):
            args = [self._as_eager_addresses(node, args[0]), *args[1:]]
        if node.target in _MATMULS:
            args = [self._matrix_operand(a) for a in args]
        call_args = [self._to_memory(a) for a in args]
        call_kwargs = {k: self._to_memory(v) for k, v in kwargs.items()}
        val = node.meta.get("val")
        buf = self._extern_results(val, node.target, call_args, call_kwargs, is_library)
        if isinstance(val, torch.Tensor) and returns_alias(node.target) and \
                _broadcast(buf.layout):
            # A view of a value Ember realized densely (an expanded ``arange``): ATen's
            # result follows the dense input, not eager's stride-0 layout, which no buffer
            # can be copied into. Kernels read it densely (the graph is functional: a copy
            # serves as well as the view).
            buf.layout.stride = contiguous_strides(buf.layout.size)
        return buf

    def _as_eager_addresses(self, node: torch.fx.Node, value: IRNode) -> IRNode:
        """The first argument of an op that addresses its storage (``STORAGE_VIEWS``, and
        ``as_strided_scatter``, which addresses a clone of it: ``clone_layout``), laid out
        as eager's; other ops take ``value`` as it is."""
        fx_arg = node.args[0]
        val = fx_arg.meta.get("val") if isinstance(fx_arg, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            return value
        if node.target in STORAGE_VIEWS:
            view = strided_view(self, fx_arg, val.shape, val.stride(), val.storage_offset())
            if view is NotImplemented:
                raise NotImplementedError(f"{node.target} of {fx_arg}, whose eager storage "
                                          f"Ember does not hold")
            return view
        if node.target is not torch.ops.aten.as_strided_scatter.default:
            return value
        want = clone_layout(val)
        want.device = value.get_device()
        if isinstance(value, (Buffer, ReinterpretView)) and value.layout.offset == 0 and \
                same_strides(value.layout.size, value.layout.stride, want.size, want.stride):
            return value
        return self.realize(value, want)

    def library_call(self, target, args: list, val):
        """``target(*args)`` by its library (ATen) kernel from the wrapper, with a result
        like ``val`` (a lowering that runs a different library op than its own): an
        ExternBuffer, or a tuple of them (and None) where ``val`` is a tuple."""
        compile_stats.extern_calls[str(target)] += 1
        if target in _MATMULS:
            args = [self._matrix_operand(a) for a in args]
        return self._extern_results(val, target, [self._to_memory(a) for a in args], {}, True)

    def _extern_results(self, val, target, args, kwargs, is_library):
        """The ExternBuffer of one call's result like ``val``; for a tuple, a parent call
        and one child per tensor in it."""
        if isinstance(val, torch.Tensor):
            return self._extern(val, target, args, kwargs, is_library)
        parent = ExternBuffer(self.new_name(), None, target, args, kwargs, is_library)
        self.buffers.append(parent)
        return self._extern_children(parent, val, ())

    def _matrix_operand(self, a):
        """A transposed body as a matmul's operand (a weight's cast ``t(w.to(bf16))``):
        the body realized in its own layout and passed as a transposed view of it, as eager
        passes it. The library reads either order; a transposed copy is a slow kernel on a
        GPU (vit_base's AMP training step: 22 of them, 0.95 ms of 13.1 on an H100)."""
        perm, inner = None, a
        while getattr(inner, "permutation", None) is not None:    # t(t(x)) is x
            perm = inner.permutation if perm is None else \
                tuple(inner.permutation[d] for d in perm)
            inner = inner.data
        n = len(perm) if perm else 0
        if n < 2 or perm not in (tuple(range(n)), (*range(n - 2), n - 1, n - 2)):
            return a
        base = self.memory(inner)
        layout = base.layout
        return ReinterpretView(base.data if isinstance(base, ReinterpretView) else base,
                               Layout(layout.device, layout.dtype,
                                      [layout.size[d] for d in perm],
                                      [layout.stride[d] for d in perm], layout.offset))

    def _extern(self, val, target, args, kwargs, is_library):
        buf = ExternBuffer(self.new_name(), _base_layout(val), target, args, kwargs,
                           is_library)
        buf.origins = self._ops([self._node] if self._node is not None else [])
        self.buffers.append(buf)
        return buf

    def _extern_children(self, parent, val, path):
        if isinstance(val, torch.Tensor):
            child = ExternBuffer(self.new_name(), _base_layout(val), None, [], {},
                                 parent.is_library)
            child.parent = parent
            child.result_index = path
            self.buffers.append(child)
            return child
        if isinstance(val, (list, tuple)):
            return type(val)(self._extern_children(parent, v, path + (i,))
                             for i, v in enumerate(val))
        return val

    def _to_memory(self, a):
        if isinstance(a, IRNode):
            return self.memory(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self._to_memory(x) for x in a)
        return a

    def defer_input_copy(self, dst, src):
        """``copy_(graph_input, new_value)`` (the tracer puts them at the end of the graph):
        written in place by :meth:`apply_input_copies` once the outputs are computed."""
        if not isinstance(dst, InputBuffer):
            raise NotImplementedError("copy_ into something other than a graph input")
        if not _is_identity(src, dst):     # e.g. eval BatchNorm "updating" its running stats
            self.input_copies.append((dst, src))
        return dst

    def apply_input_copies(self) -> None:
        """Kernels that write each mutated input's new value into its memory. A new value
        that reads another mutated input, or its own input at another index, is first
        computed into a buffer of its own: the copies overwrite those inputs one by one."""
        from ember.backend.scheduler import extract_reads
        targets = {dst.name for dst, _ in self.input_copies}
        sources = []
        for dst, src in self.input_copies:
            self._lowering = self._inlined_origins(src)
            if isinstance(src, IRNode):
                idx = index_vars("x", len(src.get_size()))
                reads = extract_reads(src.make_loader(), idx)
                want = dst.layout.index(idx)
                if any(name in targets and (name != dst.name or
                                            sympy.simplify(index - want) != 0)
                       for name, index in reads):
                    src = self.realize(Pointwise(src.get_device(), src.get_dtype(),
                                                 src.make_loader(), src.get_size()))
            sources.append(src)
        for (dst, _), src in zip(self.input_copies, sources):
            if dst.get_dtype() not in self.target.dtypes or (
                    isinstance(src, IRNode) and src.get_dtype() not in self.target.dtypes):
                # a dtype the target has no kernels for (float16 on the C++ target): ATen
                # writes the input, as the ops that computed the new value ran there too
                op = aten_copy if isinstance(src, IRNode) else aten_fill
                compile_stats.fallback_ops[str(op)] += 1
                self.buffers.append(ExternBuffer(self.new_name(), dst.layout, op,
                                                 [dst, self._to_memory(src)], {}, False))
                continue
            data = Pointwise(dst.get_device(), dst.get_dtype(),
                             _cast_loader(src, dst.get_dtype()), dst.get_size())
            buf = ComputedBuffer(self.new_name(), dst.layout, data, mutates=dst.name)
            buf.origins = self._ops(self._inlined_origins(src))
            self.buffers.append(buf)

    def finish_output(self, value, fx_node, outputs: set = frozenset()):
        """Outputs keep eager's strides; views of memory are returned as views, and so is a
        view of another output (of the ``outputs`` nodes): eager's results share memory."""
        if not isinstance(value, IRNode):
            return value
        val = fx_node.meta.get("val") if isinstance(fx_node, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and storage_owner(fx_node) in outputs - {fx_node}:
            view = strided_view(self, fx_node, val.shape, val.stride(), val.storage_offset())
            if view is not NotImplemented:
                return view
        want = _base_layout(val) if isinstance(val, torch.Tensor) else None
        if isinstance(value, (Buffer, ReinterpretView)):
            layout = value.layout if value.layout is not None else want
            if want is None or same_strides(layout.size, layout.stride, want.size, want.stride):
                return value
        # a slice of an intermediate keeps eager's strides (gaps left unwritten: what
        # torch.compile returns too); an expanded one is realized contiguous
        if want is not None and not want.is_non_overlapping():
            want = None
        return self.realize(value, want)


# sympy's words for an int(), float() or comparison a symbolic size cannot answer
_NEEDS_STATIC = re.compile(r"Cannot convert (symbols|expression) to (int|float)|"
                           r"cannot determine truth value of Relational")


def _needs_static_size(e: Exception) -> bool:
    """``e`` is sympy refusing to make a number or a truth value of a symbolic size, in a
    graph with symbolic sizes (``sizevars.symbols``)."""
    return isinstance(e, TypeError) and bool(sizevars.symbol_names()) and bool(
        _NEEDS_STATIC.search(str(e)))


class _LoadProbe:
    """An ops handler under which only a plain load gives something back: (name, index).
    A cast to the loaded buffer's own dtype (``_to_copy`` of a running stat) keeps it."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def load(self, name, index):
        return (name, index)

    def to_dtype(self, value, dtype):
        return value if dtype == self.dtype else None

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _is_identity(src, dst: Buffer) -> bool:
    """``src`` reads ``dst`` element for element, unchanged: copying it back is a no-op."""
    if src is dst:
        return True
    if not isinstance(src, IRNode) or src.get_dtype() != dst.get_dtype() or \
            list(src.get_size()) != list(dst.get_size()):
        return False

    idx = index_vars("x", len(dst.get_size()))
    with use_handler(_LoadProbe(dst.get_dtype())):
        value = src.make_loader()(idx)
    return (isinstance(value, tuple) and value[0] == dst.name
            and sympy.simplify(value[1] - dst.layout.index(idx)) == 0)


def _broadcast(layout: Layout) -> bool:
    """Some dim of more than one element has stride 0 (its elements share memory)."""
    return any(sympy.sympify(st) == 0 and not sizevars.statically_known_equals(sz, 1)
               for sz, st in zip(layout.size, layout.stride))


def _base_layout(t: torch.Tensor) -> Layout:
    """A tensor's layout with offsets counted from its data pointer (what kernels receive)."""
    layout = Layout.from_tensor(t)
    layout.offset = sympy.Integer(0)
    return layout


def _cast_loader(src, dtype):
    from ember.backend.ops import ops
    if not isinstance(src, IRNode):
        return lambda index: ops.constant(src, dtype)
    load = src.make_loader()
    if src.get_dtype() == dtype:
        return load
    return lambda index: ops.to_dtype(load(index), dtype)
