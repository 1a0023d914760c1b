"""ATen-level tracing: a torch-level FX graph -> a functional ATen-level FX graph (inference).

    ag = trace_to_aten(gm, example_inputs)      # AtenGraph(gm=..., input_mutations=[...])
    ag.gm(*real_inputs)                         # same outputs (and input mutations) as gm

How it works
------------
``gm`` runs on Ember fake tensors (``ember.fake.FakeTensorMode``, inputs converted with
``from_real``) with ``_AtenTracer``, a ``TorchDispatchMode``, stacked above the fake mode. Every
ATen op reaching the dispatcher comes first to the tracer, which (1) lifts real tensors met in
the arguments (parameters read through ``get_attr``, constants) to fakes and records a
``get_attr`` node holding the *same* real tensor object (never a copy: optimizers update it in
place), (2) functionalises mutating ops, (3) runs the op's decomposition under the tracer when
the table has one, else (4) runs the op on the fakes (the fake mode below computes metadata)
and records one ``call_function`` node whose target is the ``OpOverload``; tuple/list outputs
get ``operator.getitem`` nodes. Every node carries ``meta["val"]`` (its fake), and a node
recorded while an op decomposes ``meta["original_aten"]``, the outermost op decomposed (the
kernels computing it are named for it). Tensors are
mapped to their current node by object identity (fakes are kept alive for the duration of the
trace, so ids are not reused). CompositeImplicitAutograd ops (``linear``, ``layer_norm``...)
decompose in C++ before reaching the tracer; when one is called from inside a decomposition
(below autograd) it reaches the tracer, which runs its implicit kernel (``op.decompose``).

Functionalisation
-----------------
* An op whose schema writes an argument (``add_``, ``copy_``, ``index_put_``, ``relu_``...) is
  recorded as its out-of-place twin: same name without the trailing ``_`` and the same
  overload (``aten.add_.Tensor`` -> ``aten.add.Tensor``), or ``<name>_functional`` which returns
  the new values of the written arguments after the usual outputs
  (``_native_batch_norm_legit`` in training). A result whose dtype differs from the mutated
  tensor (``int_tensor.add_(0.5)`` is rejected by eager anyway; ``half.add_(float)`` is not)
  is cast back with ``_to_copy``. The mutated tensor is then re-pointed at the new node:
  later uses read the new value, and the op returns the mutated tensor object itself.
* Mutations of graph *inputs* are recorded (``AtenGraph.input_mutations``) and replayed at the
  end of the graph as ``aten.copy_.default(input, new_value)`` nodes, so the user still sees
  the mutation. If the mutated input itself is returned (``x.add_(1)`` returns ``x``), the
  output is that ``copy_`` node, i.e. the input tensor, as in eager: the value is not
  computed a second time, and a backend that computes outputs lazily cannot read the input
  after its ``copy_`` has overwritten it. (A different tensor holding the new value, e.g.
  ``y`` of ``x.copy_(y)``, stays the new-value node.)
* View ops (``view``, ``t``, ``slice``, ``select``, ``expand``, ``permute``...) stay as view
  ops. An in-place op on a tensor that shares storage with others (a view, or a tensor with
  views) writes through to the storage's *owner* (the first traced tensor of that storage,
  which covers it densely: an op output or a graph input): its new value is
  ``as_strided_scatter(owner, new_view_value, view geometry)``. Each storage carries a version
  bumped by every write, and each traced tensor the version its node was made at; a tensor
  read after a write to its storage by another alias gets a fresh node,
  ``as_strided(owner's new value, its geometry)``. So ``x[:, :4].add_(y)`` followed by reads
  of ``x`` or of any view of it sees the write, as in eager. Not supported
  (``NotImplementedError``; callers fall back): a write into a storage whose owner does not
  cover it densely from offset 0, or that two graph inputs share; an ``out=`` op; an in-place
  op that changes geometry (``unsqueeze_``, ``t_``, ``resize_``); a mutating op with no
  functional twin and no decomposition (e.g. ``normal_``).

Scope
-----
``trace_to_aten`` traces inference graphs: if grad mode is on and any input (or a parameter
of ``gm``) requires grad, ``NotImplementedError("training graphs: ...")`` (those go to
``ember.aot.joint.trace_joint``); otherwise the trace runs under ``torch.no_grad()``. Both
share the setup (``begin_trace``) and the replay of input mutations (``replay_mutations``). Sizes are static unless the caller gives a fake mode with a
ShapeEnv and its fakes and SymInts (``begin_trace``'s ``fake_mode``): SymInts then stay in
the recorded ops' arguments (their expressions are read by the backend); otherwise a
non-tensor graph input raises ``NotImplementedError``. Dead nodes are removed afterwards (mutating and random ops are kept).
"""
from __future__ import annotations

import contextlib
import operator
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ember import logs
from ember.fake import FakeTensor, FakeTensorMode, map_args, storage_key

__all__ = ["AtenGraph", "TraceState", "begin_trace", "output_node", "replay_mutations",
           "trace_to_aten"]

aten = torch.ops.aten


@dataclass
class AtenGraph:
    gm: torch.fx.GraphModule          # ATen-level; gm(*real_inputs) == original outputs
    input_mutations: list[int] = field(default_factory=list)   # indices of mutated inputs


def _covers_densely(t: torch.Tensor) -> bool:
    """Its elements fill a block of memory without gaps or overlaps (in some dim order)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _written_args(op) -> list[tuple[int, torch._C.Argument]]:
    return [(i, a) for i, a in enumerate(op._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def _bind(op, args, kwargs) -> list:
    """Values of the schema arguments of ``op``, in schema order (defaults filled in)."""
    vals = []
    for i, a in enumerate(op._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            vals.append(args[i])
        elif a.name in kwargs:
            vals.append(kwargs[a.name])
        else:
            vals.append(a.default_value if a.has_default_value() else None)
    return vals


_functional_cache: dict = {}


def _signature(op) -> list:
    """(name, type, kwarg_only) of each argument, alias annotations left out."""
    return [(a.name, str(a.type), a.kwarg_only) for a in op._schema.arguments]


def _functional_variant(op):
    """(functional_op, kind) for a mutating op; kind is 'inplace' or 'functional'; or None."""
    if op in _functional_cache:
        return _functional_cache[op]
    packet = op._schema.name.split("::")[-1]
    ns = getattr(torch.ops, op.namespace)
    overload = op._overloadname
    found = None
    candidates = []
    if packet.endswith("_") and not packet.endswith("__"):
        candidates.append((packet[:-1], "inplace"))
    candidates.append((packet + "_functional", "functional"))
    for name, kind in candidates:
        pkt = getattr(ns, name, None)
        if pkt is None:
            continue
        fop = getattr(pkt, overload, None)
        if fop is None and kind == "functional":
            fop = getattr(pkt, "default", None)
        if kind == "inplace" and (fop is None or _signature(fop) != _signature(op)):
            # the same overload name can be another op (``aten::ldexp(float, int)`` is the
            # ``default`` of ``ldexp`` while ``ldexp_.default`` takes tensors): match the
            # arguments, by name and type, in any order (``polygamma_(self, n)`` is
            # ``polygamma(n, self)``; ``functionalize`` reorders them)
            want = sorted(_signature(op))
            fop = next((getattr(pkt, o) for o in pkt.overloads()
                        if sorted(_signature(getattr(pkt, o))) == want), None)
        if fop is not None and not fop._schema.is_mutable and not any(
                r.alias_info is not None for r in fop._schema.returns):
            # (a view op is no functional twin: ``transpose_`` changes geometry, not data)
            found = (fop, kind)
            break
    _functional_cache[op] = found
    return found


_implicit_cache: dict = {}


def _has_implicit_kernel(op) -> bool:
    r = _implicit_cache.get(op)
    if r is None:
        r = _implicit_cache[op] = torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd")
    return r


def is_impure(node: torch.fx.Node) -> bool:
    """Kept by dead-code elimination though nothing reads it: inputs, the output, and ops
    that write or draw random numbers."""
    t = node.target
    if node.op == "call_function" and isinstance(t, torch._ops.OpOverload):
        return t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags
    return node.op in ("placeholder", "output")


class _AtenTracer(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps __torch_dispatch__ of modes in a TorchDynamo-skip shim that imports
        # torch._dynamo on first use (seconds); Ember never runs TorchDynamo
        return False

    def __init__(self, fake_mode: FakeTensorMode, graph: torch.fx.Graph, root: torch.nn.Module,
                 decompositions: dict):
        super().__init__()
        self.fake_mode = fake_mode
        self.graph = graph
        self.root = root
        self.decomps = decompositions
        self.node_of: dict[int, torch.fx.Node] = {}     # id(fake) -> current node
        self.keep: list = []                            # keeps traced fakes alive (stable ids)
        self.storage_users: dict[int, set[int]] = {}    # storage key -> ids of traced fakes
        self.storage_owner: dict[int, torch.Tensor] = {}    # storage key -> first traced fake
        self.storage_version: dict[int, int] = {}       # storage key -> writes so far
        self.node_version: dict[int, int] = {}          # id(fake) -> version its node reads
        self.frozen_inputs: set[int] = set()            # ids of inputs no write may reach
        self.input_index: dict[int, int] = {}           # id(input fake) -> input position
        self.mutated_inputs: dict[int, torch.Tensor] = {}   # position -> input fake
        self.const_count = 0
        # the outermost op being decomposed: its nodes keep it as ``meta["original_aten"]``
        # (kernel names say "layer_norm", not the mean, sub, rsqrt... it became)
        self.decomposing = None

    # -- bookkeeping ---------------------------------------------------------------------------
    def track(self, t: torch.Tensor, node: torch.fx.Node) -> None:
        key = storage_key(t)
        self.node_of[id(t)] = node
        self.keep.append(t)
        self.storage_users.setdefault(key, set()).add(id(t))
        self.storage_owner.setdefault(key, t)
        self.node_version[id(t)] = self.storage_version.get(key, 0)

    def lift_real(self, t: torch.Tensor) -> torch.Tensor:
        fake = self.fake_mode.from_real(t)
        if id(fake) not in self.node_of:
            name = f"_tensor_constant{self.const_count}"
            self.const_count += 1
            setattr(self.root, name, t)              # the same object: updates stay visible
            node = self.graph.get_attr(name)
            node.meta["val"] = fake
            self.track(fake, node)
            self.keep.append(t)
        return fake

    def to_fake(self, x):
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            return self.lift_real(x)
        return x

    def to_node(self, x):
        if isinstance(x, torch.Tensor):
            try:
                node = self.node_of[id(x)]
            except KeyError:
                raise RuntimeError(f"ember.aot: a tensor {x!r} reached an op without being "
                                   "produced by the traced graph") from None
            key = storage_key(x)
            version = self.storage_version.get(key, 0)
            if self.node_version[id(x)] != version:
                # another alias wrote this storage since ``node`` was made: read the view
                # of the owner's new value
                owner = self.storage_owner[key]
                node = self.graph.call_function(aten.as_strided.default, (
                    self.node_of[id(owner)], list(x.shape), list(x.stride()),
                    x.storage_offset()))
                node.meta["val"] = x
                self.node_of[id(x)] = node
                self.node_version[id(x)] = version
            return node
        return x

    @contextlib.contextmanager
    def _decomposing(self, func):
        outermost = self.decomposing is None
        if outermost:
            self.decomposing = func
        try:
            yield
        finally:
            if outermost:
                self.decomposing = None

    # -- dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.run_op(func, args, kwargs or {})

    def run_op(self, func, args, kwargs):
        args, kwargs = map_args(self.to_fake, args, kwargs)
        if func is aten.lift_fresh.default:          # torch.tensor(...) constant: already lifted
            return args[0]
        if func is aten.detach.default:              # the same value (autograd detaches saved
            out = func(*args, **kwargs)              # outputs): no node of its own
            self.track(out, self.to_node(args[0]))
            return out
        if func is aten._fused_sdp_choice.default:   # which attention kernel eager would run
            return _real_sdp_choice(func, args, kwargs)
        schema = func._schema
        if schema.is_mutable:
            for _, a in _written_args(func):
                if a.kwarg_only:
                    raise NotImplementedError(f"ember.aot: out= variant {func} is not supported")
        decomp = self.decomps.get(func)
        if decomp is not None:
            with self, self._decomposing(func):
                r = decomp(*args, **kwargs)
            if r is not NotImplemented:
                return r
        if _has_implicit_kernel(func):
            # Reached only from inside a decomposition (below autograd, where C++ did not
            # decompose it): run its CompositeImplicitAutograd kernel under the tracer.
            with self, self._decomposing(func):
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        if schema.is_mutable:
            return self.functionalize(func, args, kwargs)
        return self.record(func, args, kwargs)

    def record(self, func, args, kwargs):
        out = func(*args, **kwargs)                  # the fake mode below computes metadata
        n_args, n_kwargs = map_args(self.to_node, args, kwargs)
        with size_arguments():
            node = self.graph.call_function(func, tuple(n_args), dict(n_kwargs))
        node.meta["val"] = out
        if self.decomposing is not None:
            node.meta["original_aten"] = self.decomposing
        if isinstance(out, torch.Tensor):
            self.track(out, node)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta["val"] = o
                    self.track(o, item)
                elif isinstance(o, (tuple, list)) and any(isinstance(e, torch.Tensor) for e in o):
                    raise NotImplementedError(f"ember.aot: nested tensor outputs of {func}")
        return out

    def functionalize(self, func, args, kwargs):
        if func is aten.as_strided_.default:
            return self._restride(func, args, kwargs)
        variant = _functional_variant(func)
        if variant is None:
            raise NotImplementedError(f"ember.aot: mutating op {func} has no functional "
                                      "variant or decomposition")
        fop, kind = variant
        bound = _bind(func, args, kwargs)
        targets = [bound[i] for i, _ in _written_args(func)]
        for t in targets:
            if isinstance(t, torch.Tensor):
                self._check_writable(func, t)
        if kind == "inplace":
            (target,) = targets
            if fop._overloadname != func._overloadname or _signature(fop) != _signature(func):
                # found by signature: pass every argument (defaults are the in-place op's:
                # ``bernoulli_.float(self, p=0.5)`` is ``bernoulli.p(self, p)``), in its order
                values = {a.name: v for a, v in zip(func._schema.arguments, bound)}
                fargs = fop._schema.arguments
                args = tuple(values[a.name] for a in fargs if not a.kwarg_only)
                kwargs = {a.name: values[a.name] for a in fargs if a.kwarg_only}
            new = self.run_op(fop, args, kwargs)
            self.assign(func, target, new)
            return target
        outs = self.run_op(fop, args, kwargs)
        n_written = len(targets)
        results, new_values = outs[:-n_written], outs[-n_written:]
        for t, new in zip(targets, new_values):
            if isinstance(t, torch.Tensor):
                self.assign(func, t, new)
        n_returns = len(func._schema.returns)
        return results[0] if n_returns == 1 else tuple(results)

    def _restride(self, func, args, kwargs):
        """``t.as_strided_(size, stride)`` on a tensor the graph made (ATen's channels-last
        ``adaptive_avg_pool2d`` restrides its ``mean``): from here on ``t`` is the view
        ``as_strided(t, size, stride)`` of the same storage."""
        target = args[0]
        key = storage_key(target)
        if id(target) in self.input_index or self.storage_version.get(key) or \
                self.storage_users.get(key, set()) - {id(target)}:
            raise NotImplementedError("ember.aot: as_strided_ on a graph input, a view or a "
                                      "tensor with views is not supported")
        new = self.run_op(aten.as_strided.default, args, kwargs)
        func(*args, **kwargs)                        # the fake takes the new geometry
        self.node_of[id(target)] = self.node_of[id(new)]
        return target

    def assign(self, func, target: torch.Tensor, new: torch.Tensor) -> None:
        if tuple(new.shape) != tuple(target.shape):
            raise NotImplementedError(f"ember.aot: in-place op {func} changes the geometry of "
                                      "its input")
        if new.dtype != target.dtype or new.device != target.device:
            new = self.run_op(aten._to_copy.default, (new,),
                              {"dtype": target.dtype, "device": target.device})
        if id(new) not in self.node_of:              # a decomposition returned a fresh alias
            raise RuntimeError(f"ember.aot: functional result of {func} is untracked")
        key = storage_key(target)
        owner = self.storage_owner[key]
        if owner is not target:      # a write through a view: the owner gets the new values
            scattered = self.run_op(aten.as_strided_scatter.default, (
                owner, new, list(target.shape), list(target.stride()),
                target.storage_offset()), {})
            self.node_of[id(owner)] = self.node_of[id(scattered)]
        self.node_of[id(target)] = self.node_of[id(new)]
        version = self.storage_version[key] = self.storage_version.get(key, 0) + 1
        self.node_version[id(owner)] = self.node_version[id(target)] = version
        idx = self.input_index.get(id(owner))
        if idx is not None:
            self.mutated_inputs[idx] = owner

    def _check_writable(self, func, t: torch.Tensor) -> None:
        key = storage_key(t)
        if id(t) in self.frozen_inputs:
            raise NotImplementedError(f"ember.aot: in-place op {func} on an input that "
                                      "cannot be written here (it requires grad, or it is a "
                                      "tangent)")
        if not self.storage_users.get(key, set()) - {id(t)}:
            return                   # the only tensor of its storage
        owner = self.storage_owner[key]
        meta = owner._meta if isinstance(owner, FakeTensor) else owner
        dense = owner.storage_offset() == 0 and _covers_densely(owner) and \
            owner.numel() * owner.element_size() == meta.untyped_storage().nbytes()
        inputs = [u for u in self.storage_users[key] if u in self.input_index]
        if not dense or len(inputs) > 1 or (inputs and inputs[0] != id(owner)):
            raise NotImplementedError(
                f"ember.aot: in-place op {func} on a view of a storage that its first tensor "
                "does not cover densely, or that several graph inputs share")


_HOLDS = {torch.bfloat16: {torch.float32, torch.float64},     # exact widenings
          torch.float16: {torch.float32, torch.float64}, torch.float32: {torch.float64}}


def _unchanged(value: torch.fx.Node, placeholder: torch.fx.Node) -> bool:
    """``value`` is the input itself, or copies of it through dtypes that hold its every
    value exactly (``bf16 -> fp32 -> bf16``), ending in its own dtype and device."""
    original = placeholder.meta.get("val")
    if not isinstance(original, torch.Tensor):
        return value is placeholder
    final = value.meta.get("val")
    if value is not placeholder and not (isinstance(final, torch.Tensor) and
                                         final.dtype == original.dtype and
                                         final.device == original.device):
        return False
    while value is not placeholder:
        if not isinstance(value, torch.fx.Node) or value.target is not aten._to_copy.default \
                or set(value.kwargs) - {"dtype", "device", "layout"}:
            return False
        val = value.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.device != original.device or (
                val.dtype != original.dtype and val.dtype not in _HOLDS.get(original.dtype, ())):
            return False
        value = value.args[0]
    return True


def _real_sdp_choice(func, args, kwargs) -> int:
    """``scaled_dot_product_attention`` picks its kernel (flash, memory-efficient, cuDNN,
    math) from the inputs' device, dtype, shapes and strides; asked on fakes, the meta
    device's answer can differ from eager's. Ask the real function on uninitialised tensors
    of the same geometry (it reads no data), so the graph calls the kernel eager calls."""
    def real(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        return x
    with torch._C._DisableTorchDispatch():
        real_args, real_kwargs = pytree.tree_map(real, args), pytree.tree_map(real, kwargs)
        # A boolean mask reaches the fused kernels converted (``where(mask, 0, -inf)``), a
        # dense new tensor; asked with the mask as it is (an expanded ``arange >= 0`` has
        # stride 0 in its last dim) the choice is the math kernel, which computes half
        # precision in float32 (BERT's attention ran 10x slower than eager's cuDNN kernel)
        mask = real_args[3] if len(real_args) > 3 else real_kwargs.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.dtype is torch.bool and mask.dim() and \
                mask.stride(-1) != 1:
            dense = torch.empty(mask.shape, dtype=torch.bool, device=mask.device)
            if len(real_args) > 3:
                real_args = (*real_args[:3], dense, *real_args[4:])
            else:
                real_kwargs = {**real_kwargs, "attn_mask": dense}
        choice = func(*real_args, **real_kwargs)
        if choice == int(torch.nn.attention.SDPBackend.MATH) and real_args[0].is_cuda and \
                logs.enabled("perf_hints"):
            _explain_math_attention(real_args, real_kwargs)
    return choice


def _explain_math_attention(args, kwargs) -> None:
    """Log why no fused attention kernel takes these inputs (the math path is slow and, in
    half precision, computes in float32)."""
    import warnings
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    shapes = ", ".join(f"{n} {t.dtype} {list(t.shape)} stride {t.stride()}"
                       for n, t in (("q", q), ("k", k), ("v", v), ("mask", mask))
                       if isinstance(t, torch.Tensor))
    reasons = []
    try:
        params = torch.backends.cuda.SDPAParams(
            q, k, v, mask, args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0),
            args[5] if len(args) > 5 else kwargs.get("is_causal", False),
            kwargs.get("enable_gqa", False))
        for check in (torch.backends.cuda.can_use_efficient_attention,
                      torch.backends.cuda.can_use_cudnn_attention):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                check(params, True)
            reasons += [str(w.message).splitlines()[0] for w in caught]
    except (AttributeError, TypeError, RuntimeError) as e:    # another torch's API
        reasons.append(f"(reasons unavailable: {type(e).__name__})")
    logs.log("perf_hints", "attention runs the math kernel for %s: %s", shapes,
             "; ".join(reasons) or "no reason given")


class ProgramError(RuntimeError):
    """The program being traced raised on its fake inputs (an op rejected a shape or a
    stride: ``view`` of data it cannot view, say). The original error is the cause."""


def run_program(gm: torch.fx.GraphModule, fakes: list):
    """``gm.forward(*fakes)``, its errors other than ``NotImplementedError`` (a tracer limit,
    as is an op whose output sizes depend on data) raised as ``ProgramError``."""
    from ember.fake import DataDependentError
    try:
        return gm.forward(*fakes)
    except NotImplementedError:
        raise
    except DataDependentError as e:     # (torch.compile hands graphs with such ops over)
        raise NotImplementedError(f"a data-dependent op: {e}") from e
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise ProgramError(f"{type(e).__name__}: {e}") from e


@dataclass
class TraceState:
    """What ``begin_trace`` sets up: a graph with one placeholder per input, and the tracer
    stacked above a fresh fake mode (enter ``fake_mode`` then ``tracer`` to trace)."""
    graph: torch.fx.Graph
    root: torch.nn.Module
    fake_mode: FakeTensorMode
    tracer: _AtenTracer
    fakes: list
    placeholders: list


def begin_trace(gm: torch.fx.GraphModule, example_inputs: list,
                decompositions: dict | None, fake_mode: FakeTensorMode | None = None
                ) -> TraceState:
    """``fake_mode``: given, ``example_inputs`` are its fakes and its SymInts (a graph with
    symbolic sizes: ``ember.backend.symbolic``); else real tensors, faked here."""
    if decompositions is None:
        from ember.decomp import core_decompositions
        decompositions = core_decompositions()
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor) and not (fake_mode is not None and
                                                    isinstance(x, torch.SymInt)):
            raise NotImplementedError(f"ember.aot: non-tensor graph input #{i} "
                                      f"({type(x).__name__}); only static shapes are supported")
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    given = fake_mode is not None
    fake_mode = fake_mode if given else FakeTensorMode()
    tracer = _AtenTracer(fake_mode, graph, root, decompositions)
    fakes = list(example_inputs) if given else [fake_mode.from_real(x) for x in example_inputs]
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if len(names) != len(fakes):
        names = [f"arg{i}" for i in range(len(fakes))]
    placeholders = []
    for i, (name, f) in enumerate(zip(names, fakes)):
        node = graph.placeholder(name)
        node.meta["val"] = f
        placeholders.append(node)
        if not isinstance(f, torch.Tensor):     # a size (SymInt): read where it is used
            continue
        if id(f) in tracer.node_of:
            # The same tensor passed twice: both placeholders exist, uses go to the first.
            continue
        tracer.track(f, node)
        tracer.input_index[id(f)] = i
    return TraceState(graph, root, fake_mode, tracer, fakes, placeholders)


def replay_mutations(state: TraceState) -> tuple[list[int], dict[int, tuple]]:
    """Append ``copy_(input, new value)`` for each input the trace mutated. Returns the
    mutated input positions and storage key -> (the input's fake, its ``copy_`` node)."""
    tracer, placeholders = state.tracer, state.placeholders
    # an input whose final value is itself (eval-mode batch norm "updates" its running
    # statistics with a same-dtype copy of themselves) is not mutated
    mutations = [i for i in sorted(tracer.mutated_inputs) if not _unchanged(
        tracer.to_node(tracer.mutated_inputs[i]), placeholders[i])]
    copy_of: dict[int, tuple] = {}
    for i in mutations:
        target = tracer.mutated_inputs[i]
        node = state.graph.call_function(aten.copy_.default,
                                         (placeholders[i], tracer.to_node(target)))
        node.meta["val"] = state.fakes[i]
        copy_of[storage_key(target)] = (target, node)
    return mutations, copy_of


def output_node(state: TraceState, copy_of: dict, x):
    """The node an output reads: a mutated input returned is its ``copy_`` node, i.e. the
    input itself; a view of a mutated input (``x.add_(1); return x[1]``) is that view of
    the input, as in eager, not a copy of its new value (a write through the output must
    reach the input)."""
    if not isinstance(x, torch.Tensor):
        return x
    x = state.tracer.to_fake(x)
    written = copy_of.get(storage_key(x))
    if written is None:
        return state.tracer.to_node(x)
    target, node = written
    if x is target:
        return node
    view = state.graph.call_function(aten.as_strided.default, (
        node, list(x.shape), list(x.stride()), x.storage_offset()))
    view.meta["val"] = x
    return view


@contextlib.contextmanager
def size_arguments():
    """Nodes made here may take SymInt arguments without torch's warning: the ATen graph keeps
    sizes as SymInts, whose expressions lowering reads over the symbols the wrapper binds
    from the graph's inputs (backend/symbolic.py), so torch's advice (make each a node) does
    not apply, and users should not see it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Raw Sym(Int|Float|Bool) value",
                                category=UserWarning)
        yield


def trace_to_aten(gm: torch.fx.GraphModule, example_inputs: list, *,
                  decompositions: dict | None = None,
                  fake_mode: FakeTensorMode | None = None) -> AtenGraph:
    """Trace ``gm`` (torch-level FX) on fakes of ``example_inputs`` into an ATen-level graph
    (``fake_mode``: ``example_inputs`` are already its fakes and SymInts, see
    ``begin_trace``)."""
    if torch.is_grad_enabled() and (any(isinstance(x, torch.Tensor) and x.requires_grad
                                        for x in example_inputs)
                                    or any(p.requires_grad for p in gm.parameters())):
        raise NotImplementedError("training graphs: trace them with "
                                  "ember.aot.joint.trace_joint")
    state = begin_trace(gm, example_inputs, decompositions, fake_mode)
    with torch.no_grad(), state.fake_mode, state.tracer:
        out = run_program(gm, state.fakes)
    mutations, copy_of = replay_mutations(state)
    state.graph.output(pytree.tree_map(lambda x: output_node(state, copy_of, x), out))
    state.graph.eliminate_dead_code(is_impure_node=is_impure)
    state.graph.lint()
    return AtenGraph(torch.fx.GraphModule(state.root, state.graph), mutations)
