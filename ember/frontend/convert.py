"""One frame -> one cache entry: capture, compile the graph, generate the entry function.

``convert_frame`` binds the call's real arguments to the function's parameters, runs the
symbolic evaluator over the function's bytecode, hands the captured graph to the backend and
returns a :class:`CacheEntry` whose ``run`` has the function's signature: it checks the
guards (returning the ``miss`` sentinel when one fails), calls the compiled graph, replays
side effects and rebuilds the return value.
"""
from __future__ import annotations

import dataclasses
import inspect
import time
import types
from typing import Any, Callable

import torch

from ember import config, logs, metrics
from ember.frontend.codegen import EntryCodegen
from ember.frontend.exc import Unsupported
from ember.frontend.guards import Guard
from ember.frontend.output_graph import OutputGraph
from ember.frontend.source import ClosureCellSource, LocalSource
from ember.frontend.translator import InstructionTranslator, _LazyLocal
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.functions import CellVariable

__all__ = ["Unsupported", "convert_frame", "CacheEntry"]


@dataclasses.dataclass
class CacheEntry:
    run: Callable                      # the entry function: the frame's signature
    check: Callable                    # same signature: None, or the first failing guard
    guards: list[Guard]
    graph: torch.fx.GraphModule | None
    source: str                        # generated Python of `run`

    def failed_guards(self, args, kwargs) -> list[str]:
        try:
            failure = self.check(*args, **kwargs)
        except Exception as e:   # a guard's expression itself failed
            return [f"guard evaluation raised {type(e).__name__}: {e}"]
        return [failure] if failure else []


def convert_frame(fn, args: tuple, kwargs: dict, settings, miss) -> CacheEntry:
    if not isinstance(fn, types.FunctionType):
        raise Unsupported(f"{type(fn).__name__} objects are not Python functions")
    code = fn.__code__
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE |
                        inspect.CO_ASYNC_GENERATOR):
        raise Unsupported(f"{code.co_name} is a generator or coroutine function")
    try:
        bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"arguments do not match the signature: {e}") from None
    bound.apply_defaults()
    start = time.perf_counter()
    output = OutputGraph(fn.__qualname__)
    symbolic_locals = {name: _LazyLocal(value, LocalSource(name))
                       for name, value in bound.arguments.items()}
    cells = {}
    for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        cells[name] = CellVariable(real_cell=cell, source=ClosureCellSource(i, name))
    tx = InstructionTranslator(code, fn.__globals__, symbolic_locals, cells, output)
    try:
        try:
            result = tx.run()
        except RecursionError:
            raise Unsupported("recursion too deep while capturing") from None
        entry = _build_entry(fn, output, result, settings, miss)
    finally:
        output.restore_global_state()
    metrics.counters["frontend"]["capture_seconds_x1000"] += int(
        1000 * (time.perf_counter() - start))
    return entry


def _collect_tensors(vt: VariableTracker, out: dict, seen: set) -> None:
    """Tensors the return value and side effects need from the graph, in a stable order."""
    from ember.frontend.variables import containers as c
    from ember.frontend.variables.objects import (DataclassDictVariable,
                                                  UserDefinedObjectVariable)
    from ember.frontend.variables.tensor import TensorVariable
    if id(vt) in seen:
        return
    seen.add(id(vt))
    if isinstance(vt, TensorVariable):
        if vt.source is None:
            out.setdefault(id(vt.node), vt.node)
        return
    if isinstance(vt, (c.BaseSequenceVariable, c.ListIteratorVariable)):
        items = vt.items
    elif isinstance(vt, c.DictVariable):
        items = list(vt.items.values()) + list(vt.keys.values())
    elif isinstance(vt, c.SetVariable):
        items = list(vt.items.values())
    elif isinstance(vt, c.DictViewVariable):
        items = [vt.dict_vt]
    elif isinstance(vt, c.SliceVariable):
        items = vt.parts
    elif isinstance(vt, UserDefinedObjectVariable) and vt.is_new:
        items = list(vt.attrs.values())
    elif isinstance(vt, DataclassDictVariable):
        items = list(vt.fields.values())
    else:
        return
    for item in items:
        _collect_tensors(item, out, seen)


def _build_entry(fn, output: OutputGraph, result: VariableTracker, settings, miss):
    output.distinct_object_guards()
    side_values = output.side_effects.values()
    needed: dict[int, torch.fx.Node] = {}
    seen: set = set()
    for vt in [result, *side_values]:
        _collect_tensors(vt, needed, seen)
    out_nodes = list(needed.values())
    gm = output.finish(out_nodes)
    has_ops = any(n.op.startswith("call_") for n in gm.graph.nodes)
    name = fn.__name__ if fn.__name__.isidentifier() else "compiled_frame"

    cg = EntryCodegen(fn)
    cg.miss = miss
    for slot, tensor in output.constant_tensor_slots().items():
        cg.consts[slot] = tensor
    for slot, module_globals in getattr(output, "_global_dicts", {}).values():
        cg.consts[slot] = module_globals
    guard_list = list(output.guards)
    guard_lines = cg.guard_lines(guard_list, lambda g: "return ___MISS")
    body: list[str] = []
    compiled = None
    if has_ops or out_nodes:
        example_inputs = [inp.value for inp in output.inputs]
        logs.log("graph", "captured graph of %s:\n%s", fn.__qualname__, gm.code)
        if settings.options:   # the "ember" backend: its options as keywords
            compiled = settings.backend(gm, example_inputs, **settings.options)
        else:                  # any backend: the plain two-argument contract
            compiled = settings.backend(gm, example_inputs)
        if not callable(compiled):
            raise TypeError(f"backend {settings.backend!r} returned {type(compiled).__name__}, "
                            f"not a callable")
        metrics.counters["frontend"]["graphs"] += 1
        graph_name = cg.const(compiled)
        args_text = ", ".join(cg.load(inp.source) for inp in output.inputs)
        body.append(f"___out = {graph_name}({args_text})")
    cg.graph_outputs = {id(node): i for i, node in enumerate(out_nodes)}
    cg.lines = []
    return_expr = cg.reconstruct(result)
    effects = output.side_effects.codegen(cg)
    body += cg.lines + effects + [f"return {return_expr}"]
    src, run = cg.build(guard_lines, body, name)

    # The diagnostic twin: same guards, answers which one failed.
    diag = EntryCodegen(fn)
    diag.miss = "a guard expression raised (a value changed type or lost an attribute)"
    diag.consts = dict(cg.consts)
    diag._const_ids = dict(cg._const_ids)
    diag_lines = diag.guard_lines(guard_list, lambda g: f"return {g.describe()!r}")
    _, check = diag.build(diag_lines, ["return None"], name + "_check")

    _log_and_dump(fn, gm, src, guard_list, has_ops)
    return CacheEntry(run, check, guard_list, gm if has_ops else None, src)


def _log_and_dump(fn, gm, src, guard_list, has_ops) -> None:
    if logs.enabled("guards"):
        logs.log("guards", "guards of %s:\n%s", fn.__qualname__,
                 "\n".join("  " + g.describe() for g in guard_list))
    if logs.enabled("bytecode"):
        import dis
        import io
        buf = io.StringIO()
        dis.dis(fn.__code__, file=buf)
        logs.log("bytecode", "original bytecode of %s:\n%s\ngenerated entry:\n%s",
                 fn.__qualname__, buf.getvalue(), src)
    folder = logs.debug_frame_dir(fn.__qualname__)
    if folder is not None:
        import dis
        import io
        buf = io.StringIO()
        dis.dis(fn.__code__, file=buf)
        logs.dump(folder, "original_bytecode.txt", buf.getvalue())
        logs.dump(folder, "entry.py", src)
        compiled = compile(src, "entry.py", "exec")
        buf = io.StringIO()
        dis.dis(compiled, file=buf)
        logs.dump(folder, "entry_bytecode.txt", buf.getvalue())
        logs.dump(folder, "graph.py", gm.code if has_ops else "# no graph: no tensor ops\n")
        logs.dump(folder, "guards.txt", "\n".join(g.describe() for g in guard_list) + "\n")
