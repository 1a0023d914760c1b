"""One compile of a graph with symbolic sizes, serving every size (issue 31, the backend).

    compiled = compile_symbolic(gm, example_inputs, options, per_size)

How
---
* **Symbols.** A fresh ``ember.shapes.ShapeEnv`` gets one symbol per size placeholder of the
  graph (its hint: the value seen; its source: ``a[i]``, the placeholder's position in the
  call's arguments; no duck sizing, as the frontend chose which sizes are equal). The
  frontend's own symbols (torch's or another Ember ShapeEnv's, read from each placeholder's
  ``SymInt.node.expr``) map to these; each tensor input's symbolic fake
  (``meta["val"]`` or ``meta["example_value"]``) gives its sizes and strides as expressions
  over the frontend's symbols, rewritten over the new ones (``FakeTensorMode.
  from_real_with_geometry``).
* **Trace, lower, generate.** ``trace_to_aten`` runs on these fakes and SymInts (SymInts stay
  in the ATen ops' arguments); lowering and code generation run with the env's symbols
  known to ``sizevars`` (hints for heuristics, ranges for facts), so sizes, strides and
  indices are expressions over ``s0, s1, ...``. The target must take sizes as kernel
  arguments (``Target.takes_size_arguments``); the wrapper binds each symbol from the call's
  int arguments and computes buffer sizes, strides and ATen call arguments from them.
* **Guards.** What the trace or the lowering decided about sizes is the env's guards, one
  Python expression over the call's arguments, checked on every call; a call that fails it
  goes to ``per_size`` (the per-size path of ``dynamic.py``).
* **Graph cache.** An inference graph's entry is keyed on its symbolic inputs (sizes as
  ``s0, s1, ...``, never the hints) and holds the guards with the wrapper and kernels.
* **Torch-level passes** (attention masks, dead convolution taps, channels-last layout) run
  as in the static pipeline, on a copy of the graph whose values are the backend's fakes
  (``passes/symbolic_graph.py``: what each decides from sizes). Code generation choices
  that depend on a size's value for correctness stay static-only (``sizevars``); the
  others use the hints.
* **Training graphs** (inputs that require grad): the joint graph is traced on the same
  fakes, partitioned (costs at the hints), and both halves compiled symbolically; the
  backward takes the size inputs' values after its tangents (``ember.aot.training``).
* **CUDA graphs** (``cudagraphs=True``): one graph captured per size over the one program
  (``runtime/cudagraphs.py``, the most recent sizes kept).
* **Eager choice**: compiled program or the captured graph run eagerly, chosen per size
  (``runtime/eager_choice.py``).
* **Declines** (``NotImplementedError``, then ``dynamic.py`` compiles per size): a target
  without size arguments, ``freezing``, a training graph that turns grad mode on, inputs a
  frontend symbol of which has no placeholder, a tensor input without a symbolic fake,
  inputs that share memory, a SymFloat input, and any lowering or generator that needs a
  static size. (An input that is a view is seen as a tensor of its own: kernels address
  inputs from their data pointers.)
"""
from __future__ import annotations

import time
from typing import Callable

import sympy
import torch

from ember import logs
from ember.aot.autocast import autocast_off
from ember.backend import compile_stats, sizevars
from ember.backend.runtime import eager_choice, graph_cache
from ember.backend.targets import kernel_device, target_for
from ember.shapes import ShapeEnv


class BackendShapeEnv(ShapeEnv):
    """The ShapeEnv of one symbolic compile. While the trace runs, a decision on sizes is a
    guard, as anywhere (a decomposition's branch). While lowering and generating code
    (``generating``), a value a size would be pinned to (``int(s)``, ``s == 6`` true) raises
    ``NotImplementedError`` instead, unless the trace guarded the same: the lowering is not
    symbolic (its op runs ATen), and one program keeps serving every size. A decision that
    only excludes sizes (``s > 16``, ``s != 2``) stays a guard; sizes that fail it are
    compiled per size."""
    generating = False

    def evaluate(self, expr):
        if self.generating:
            e = self.replace(sympy.sympify(expr))
            if self.static_value(e) is None:
                fact = self._fact(e)
                if isinstance(fact, sympy.Eq) and fact not in self._guard_exprs:
                    raise NotImplementedError(f"the value of the symbolic size {e} is needed")
        return super().evaluate(expr)

    def _fact(self, e):
        """The guard evaluating ``e`` would record (as ``ShapeEnv.evaluate`` words it)."""
        from ember.shapes.env import _canonical
        value = self.hint_value(e)
        if isinstance(e, sympy.Rel):
            return _canonical(e if value is sympy.true else sympy.Not(e))
        if isinstance(e, (sympy.logic.boolalg.BooleanFunction, sympy.logic.boolalg.BooleanAtom)):
            return None
        return sympy.Eq(e, value)


def _expr(value):
    node = getattr(value, "node", None)
    return node.expr if node is not None else sympy.Integer(int(value))


def _fake_meta(node: torch.fx.Node):
    for key in ("val", "example_value"):
        value = node.meta.get(key)
        if isinstance(value, torch.Tensor):
            return value
    return None


def _frontend_range(value: torch.SymInt, expr: sympy.Symbol) -> tuple[int | None, int | None]:
    """The bounds the frontend knows for a size symbol (``mark_dynamic(min=, max=)``): from
    Ember's ShapeEnv or torch's; None where unbounded or unknown. They reach the backend's
    symbol, so a choice may rest on them (a reduction whose length the range bounds)."""
    node = value.node
    try:
        if hasattr(node, "env"):                      # Ember's SymNode
            bounds = node.env.range_of(expr)
        else:                                         # torch's, over its ShapeEnv
            bounds = node.shape_env.var_to_range.get(expr)
    except AttributeError:
        return None, None
    if bounds is None:
        return None, None

    def finite(v):
        v = sympy.sympify(v)
        return int(v) if v.is_Integer else None
    return finite(bounds.lower), finite(bounds.upper)


def symbolic_inputs(gm: torch.fx.GraphModule, example_inputs: list):
    """(env, fake mode, the fakes and SymInts to trace with, the symbol of each size
    placeholder by position)."""
    from ember.fake import FakeTensorMode
    env = BackendShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=env)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise NotImplementedError("placeholders and example inputs differ in number")
    mapping: dict = {}       # frontend symbol -> expression over env's symbols
    size_symbols: dict[int, sympy.Expr] = {}
    for i, value in enumerate(example_inputs):
        if isinstance(value, (torch.SymFloat, torch.SymBool)):
            raise NotImplementedError(f"graph input #{i} is a {type(value).__name__}")
        if isinstance(value, torch.SymInt):
            expr = value.node.expr
            if not isinstance(expr, sympy.Symbol):
                raise NotImplementedError(f"size input #{i} is the expression {expr}, not a "
                                          f"symbol")
            if expr in mapping:      # two inputs of one symbol (the frontend equated them)
                size_symbols[i] = mapping[expr]
                continue
            hint = value.node.hint
            if hint is None:
                raise NotImplementedError(f"size input #{i} ({expr}) has no hint")
            if int(hint) < 0:      # an int input that is not a size: symbols are sizes
                raise NotImplementedError(f"int input #{i} ({expr}) is negative")
            low, high = _frontend_range(value, expr)
            new = env.create_symbol(int(hint), f"a[{i}]", duck=False, min=low, max=high)
            mapping[expr] = new
            size_symbols[i] = new
    fakes = []
    storages: set = set()
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if isinstance(value, torch.SymInt):
            fakes.append(env.wrap(size_symbols[i]))
            continue
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"graph input #{i} of type {type(value).__name__}")
        meta = _fake_meta(node)
        if meta is None:
            if mapping and value.dim():     # (a 0-dim tensor has no size to be symbolic)
                raise NotImplementedError(f"tensor input #{i} ({node.name}) has no symbolic "
                                          f"fake in its meta")
            meta = value
        # (comparing the frontend's SymInts would guard on its ShapeEnv: only numbers)
        if meta.dim() != value.dim() or any(
                not isinstance(m, torch.SymInt) and m != v for m, v in zip(meta.shape,
                                                                           value.shape)):
            raise NotImplementedError(f"tensor input #{i}'s fake and value differ in shape")
        geometry = []
        for part in (meta.shape, meta.stride()):
            exprs = []
            for s in part:
                e = _expr(s)
                free = e.free_symbols - set(mapping)
                if free:
                    raise NotImplementedError(
                        f"tensor input #{i} ({node.name}) has sizes over symbols with no "
                        f"size input: {sorted(map(str, free))}")
                e = e.xreplace(mapping)
                if e.atoms(sympy.Function):
                    raise NotImplementedError(f"tensor input #{i}'s geometry {e}")
                exprs.append(e)
            geometry.append(exprs)
        if all(e.is_Integer for part in geometry for e in part):
            fakes.append(mode.from_real(value))     # static: as the static trace fakes it
            continue
        # a symbolic fake has a storage of its own: inputs sharing memory would lose that
        storage = value.untyped_storage().data_ptr()
        if storage in storages or any(isinstance(v, torch.Tensor) and v is not value and
                                      v.untyped_storage().data_ptr() == storage
                                      for v in example_inputs):
            raise NotImplementedError(f"tensor input #{i} shares memory with another input")
        storages.add(storage)
        fakes.append(mode.from_real_with_geometry(value, *geometry))
    return env, mode, fakes, size_symbols


def compile_symbolic(gm: torch.fx.GraphModule, example_inputs: list, options: dict,
                     per_size: Callable) -> Callable:
    """``gm`` compiled once for every size its guards admit; other sizes go to
    ``per_size``. Raises ``NotImplementedError`` where the symbolic path declines."""
    from ember.aot.trace import size_arguments
    with size_arguments():      # graph passes copy nodes whose arguments are sizes
        return _compile_symbolic(gm, example_inputs, options, per_size)


def _compile_symbolic(gm: torch.fx.GraphModule, example_inputs: list, options: dict,
                      per_size: Callable) -> Callable:
    from ember.aot import enables_grad, may_record_grad, trace_to_aten
    from ember.backend.passes.layout import changed_output
    from ember.backend.passes.symbolic_graph import in_best_layout_symbolic
    from ember.backend.pipeline import generate, instantiate
    from ember.decomp import core_decompositions
    start = time.perf_counter()
    stages_before = dict(compile_stats.compile_seconds)
    captured = gm      # what runs eagerly where that is faster (runtime/eager_choice.py)
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    device = kernel_device(tensors)
    target = target_for(device, options["cpu_backend"], debug=options["debug"],
                        autotune=options["max_autotune"])
    if not target.takes_size_arguments:
        raise NotImplementedError(f"the {target.name} target takes no size arguments yet")
    if options["freezing"]:
        raise NotImplementedError("freezing=True")
    training = may_record_grad(tensors, enables_grad(gm))
    if training and enables_grad(gm):
        raise NotImplementedError("a training graph that turns grad mode on")
    if torch._C._is_any_autocast_enabled():
        raise NotImplementedError("a graph compiled inside an autocast region")
    # 0-dim tensors read by ``.item()`` (a module's eps): their values are constants,
    # checked per call
    from ember.backend.passes.specialize import item_inputs, specialize_graph
    items = {i: example_inputs[i].item() for i in item_inputs(gm)}
    if items:
        gm = specialize_graph(gm, {}, items, keep_meta=True)
    env, mode, fakes, size_symbols = symbolic_inputs(gm, example_inputs)

    def generate_aten(g: torch.fx.GraphModule):
        """An ATen graph over ``env``'s symbols, generated from its placeholders' fakes."""
        lowering_inputs = [n.meta["val"] for n in g.graph.nodes if n.op == "placeholder"]
        env.generating = True
        try:
            with sizevars.symbols(env), autocast_off():
                return generate(g, lowering_inputs, target, device,
                                fused_random=not options["fallback_random"])
        finally:
            env.generating = False

    def compile_aten(g: torch.fx.GraphModule, inputs=None) -> Callable:
        with autocast_off():
            return instantiate(generate_aten(g), target)

    item_checks = [f"a[{i}].item() == _item{i}" for i in items]
    # the graph cache: keyed on the symbolic inputs (no hint), the entry holds the guards
    cache_key = graph_cache.key(gm, [*fakes, *(("item", i, v) for i, v in items.items())],
                                options, target) \
        if graph_cache.enabled() and not training else None
    artifact = graph_cache.load(cache_key) if cache_key else None
    if artifact is not None and artifact.guards:
        with autocast_off():
            compiled = instantiate(artifact, target)
        text = artifact.guards
        logs.log("output_code", "graph cache hit (symbolic sizes): %d kernels",
                 len(artifact.kernels))
    elif training:     # forward and backward halves, each compiled once for every size
        from ember.aot.training import compile_training
        compiled = in_best_layout_symbolic(
            gm, example_inputs, fakes, mode, target, True,
            lambda g: compile_training(g, fakes, compile_graph=compile_aten,
                                       decompositions=core_decompositions(), fake_mode=mode))
        text = " and ".join([env.guards_as_python(), *item_checks])
    else:
        with compile_stats.timed("aot trace"):
            aten = in_best_layout_symbolic(
                gm, example_inputs, fakes, mode, target, False,
                lambda g: trace_to_aten(g, fakes, decompositions=core_decompositions(),
                                        fake_mode=mode),
                check=lambda g, traced: changed_output(g, traced.gm))
        artifact = generate_aten(aten.gm)
        with autocast_off():
            compiled = instantiate(artifact, target)
        text = " and ".join([env.guards_as_python(), *item_checks])
        if cache_key:
            artifact.guards = text
            graph_cache.store(cache_key, artifact)
    program = compiled
    replays = options["cudagraphs"] and target.supports_cudagraphs
    if replays:
        from ember.backend.runtime import cudagraphs
        compiled = cudagraphs.replay(compiled, gm, example_inputs, training=training,
                                     per_size=True)
    compiled = eager_choice.choose(compiled, captured, options, target, program,
                                   training=training, rewritten=replays, per_size=True)
    check = eval(f"lambda a: {text}", {**_guard_globals(),
                                       **{f"_item{i}": v for i, v in items.items()}})
    from ember.backend.pipeline import log_stage_times
    log_stage_times(gm, stages_before, time.perf_counter() - start, "with symbolic sizes ")
    logs.log("output_code", "compiled %d-node graph with symbolic sizes %s in %.3f s; "
             "guards: %s", len(gm.graph.nodes),
             ", ".join(f"{s}=a[{i}]" for i, s in size_symbols.items()),
             time.perf_counter() - start, text)
    return _Guarded(compiled, check, text, per_size)


def _guard_globals() -> dict:
    from ember.shapes import GUARD_GLOBALS
    return dict(GUARD_GLOBALS)


class _Guarded:
    """The symbolic program where the call's sizes pass its guards, else ``per_size``."""

    def __init__(self, compiled: Callable, check: Callable, text: str, per_size):
        self.compiled = compiled
        self.check = check
        self.guards = text
        self.per_size = per_size
        self.source = getattr(compiled, "source", None)
        self.kernel_sources = getattr(compiled, "kernel_sources", [])

    def __call__(self, *args):
        if self.check(args):
            return self.compiled(*args)
        self.per_size.reason = f"the sizes fail the symbolic program's guards ({self.guards})"
        return self.per_size(*args)
