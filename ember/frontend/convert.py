"""One frame -> one cache entry: capture, compile the graph, generate the entry function.

``convert_frame`` binds the call's real arguments to the function's parameters, runs the
symbolic evaluator over the function's bytecode, hands the captured graph to the backend and
returns a :class:`CacheEntry` whose ``run`` has the function's signature: it checks the
guards (returning the ``miss`` sentinel when one fails), calls the compiled graph, replays
side effects and rebuilds the return value.

Graph breaks restart capture instead of rolling it back: when the evaluator raises
``Unsupported``, the error records which instruction of the top frame was running
(``break_step``, also when it came from deep inside an inlined call), and the frame is
captured again from scratch with the evaluator told to stop before that instruction. The
second capture is the checkpoint: OutputGraph, side effects, guards and the block stack (the
exits of open ``with`` blocks live on the value stack) are exactly the state before the
instruction, with nothing to undo. The entry then runs that instruction in Python and calls
the resume functions (``graph_break.py``, ``resume.py``).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import time
import types
from typing import Callable, Protocol

import torch

from ember import logs, metrics
from ember.frontend import ddp_split, graph_break, guards, resume
from ember.frontend.analysis import livevars_at
from ember.frontend.codegen import EntryCodegen
from ember.frontend.exc import GraphBreakError, Unsupported
from ember.frontend.guards import Guard
from ember.frontend.output_graph import OutputGraph
from ember.frontend.symbolic_inputs import merged_guard, property_source, property_text
from ember.frontend.source import AttrSource, ClosureCellSource, GetItemSource, LocalSource
from ember.frontend.translator import NULL, InstructionTranslator, _LazyLocal
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.container_iterators import (GUARDED_ITERATORS, DictIteratorVariable,
                                                          LazyIteratorVariable,
                                                          ListIteratorVariable,
                                                          LiveListIteratorVariable)
from ember.frontend.variables.functions import (CellRefVariable, CellVariable,
                                                NestedUserFunctionVariable,
                                                UserFunctionVariable)
from ember.frontend.variables.ctx_manager import CtxMethodVariable, GlobalContextVariable
from ember.frontend.variables.scalars import FloatInputVariable

__all__ = ["Unsupported", "convert_frame", "CacheEntry"]


@dataclasses.dataclass
class CacheEntry:
    run: Callable                      # the entry function: the frame's signature
    # -> a function of the same signature answering None or the first failing guard; built
    # when first asked (a recompile, a log): its source is as long as the entry's
    build_check: Callable[[], Callable]
    guards: list[Guard]
    graph: torch.fx.GraphModule | None
    source: str                        # generated Python of `run`

    @functools.cached_property
    def check(self) -> Callable:
        return self.build_check()

    def failed_guards(self, args, kwargs) -> list[str]:
        try:
            failure = self.check(*args, **kwargs)
        except Exception as e:   # a guard's expression itself failed
            return [f"guard evaluation raised {type(e).__name__}: {e}"]
        return [failure] if failure else []


class Callees(Protocol):
    """How generated entries reach Ember's compile entry (provided by ``ember.api``)."""

    def resume(self, fn: types.FunctionType) -> Callable:
        """A fresh compiled wrapper for a resume function (its own guards and cache)."""

    def call(self, fn, /, *args, **kwargs):
        """Call ``fn`` with user functions, methods and modules compiled on their own."""

    seen_sizes: object     # dynamic.SeenSizes: the sizes captures of these frames saw
    ddp: object            # the DistributedDataParallel compiled (ember.compile(ddp)), or None


@dataclasses.dataclass
class _Capture:
    output: OutputGraph
    tx: InstructionTranslator
    result: VariableTracker | None
    grad_mode_at_end: bool
    # autocast/inference-mode blocks open at the graph break, outermost first: the graph
    # closed them; the entry runs the instruction inside them (``_close_open_contexts``)
    reentered: list = dataclasses.field(default_factory=list)


def convert_frame(fn, args: tuple, kwargs: dict, settings, miss, callees: Callees) -> CacheEntry:
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
    try:
        capture = _capture(fn, bound.arguments, dynamic=settings.dynamic,
                           seen=getattr(callees, "seen_sizes", None))
        entry = _build_entry(fn, capture, settings, miss, _return_tail(capture), callees)
    except Unsupported as e:
        if e.symbolic_sizes and settings.dynamic is not False:
            # capture failed on symbolic sizes where static sizes may work: this frame's
            # entry is static (marked dims stay symbolic; failing again, it breaks there)
            logs.log("recompiles", "%s: capturing with static sizes: %s", fn.__qualname__,
                     e)
            return convert_frame(fn, args, kwargs, dataclasses.replace(settings, dynamic=False),
                                 miss, callees)
        if settings.fullgraph:
            raise GraphBreakError.from_unsupported(e) from None
        if e.break_step is None:
            raise
        entry = _break_entry(fn, bound.arguments, e, settings, miss, callees)
    metrics.counters["frontend"]["capture_seconds_x1000"] += int(
        1000 * (time.perf_counter() - start))
    return entry


def _capture(fn, arguments: dict, break_at: int | None = None,
             dynamic: bool | None = None, seen=None) -> _Capture:
    """Run the evaluator over ``fn``'s frame (up to the ``break_at``-th instruction);
    ``dynamic``: the ``dynamic=`` policy, ``seen``: the sizes earlier captures saw
    (``dynamic.py``)."""
    code = fn.__code__
    output = OutputGraph(fn.__qualname__, dynamic, code, seen)
    symbolic_locals = {name: _LazyLocal(value, LocalSource(name))
                       for name, value in arguments.items()}
    cells = {}
    for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        cells[name] = CellVariable(real_cell=cell, source=ClosureCellSource(i, name))
    for name in resume.cell_params(code):   # the cells of the frame a resume continues
        cell = arguments[name].cell         # (each in a resume.CellRef)
        cell_source = AttrSource(LocalSource(name), "cell")
        vt = CellVariable(real_cell=cell, source=AttrSource(cell_source, "cell_contents"),
                          cell_source=cell_source)
        output.cells_by_id[id(cell)] = vt
        symbolic_locals[name] = CellRefVariable(vt, LocalSource(name))
    for name in resume.cell_params(code):   # functions the frame made, held in its cells
        vt = symbolic_locals[name].cell
        try:
            value = vt.real_cell.cell_contents
        except ValueError:   # empty
            continue
        if type(value) is types.FunctionType and value.__code__ in _nested_codes(
                resume.origin(code)):
            vt.preload(_made_function(output, value, vt.source))
    if resume.is_resume_code(code):   # floats crossing the break: graph inputs, not guards
        for name in code.co_varnames[:code.co_argcount]:
            if type(arguments.get(name)) is float:
                output.guards.add(guards.type_match(LocalSource(name), float))
                symbolic_locals[name] = FloatInputVariable(arguments[name], LocalSource(name),
                                                           output)
    for name, made_code in resume.made_functions(fn).items():
        value = arguments.get(name)
        if type(value) is types.FunctionType and value.__code__ is made_code:
            symbolic_locals[name] = _made_function(output, value, LocalSource(name))
    tx = InstructionTranslator(code, fn.__globals__, symbolic_locals, cells, output)
    tx.break_at = break_at
    try:
        try:
            result = tx.run()
        except RecursionError:
            raise Unsupported("recursion too deep while capturing") from None
        reentered = _close_open_contexts(tx) if tx.break_index is not None else []
        return _Capture(output, tx, result, torch.is_grad_enabled(), reentered)
    finally:
        output.restore_global_state()


def _close_open_contexts(tx) -> list:
    """Close the autocast/inference-mode blocks open at the graph break in the graph (the
    graph must leave global state as it found it) and return their managers, outermost
    first. Each must be a ``with`` block of the top frame, its exit on the stack: the
    resume function enters it again there (``resume.CONTEXT``)."""
    managers = tx.output.open_context_managers()
    exits = [vt.ctx for vt in tx.stack
             if isinstance(vt, CtxMethodVariable) and vt.name == "__exit__"]
    for manager in managers:
        if manager is None or sum(m is manager for m in managers) != \
                sum(m is manager for m in exits):
            raise Unsupported("graph break while an autocast/inference-mode context entered "
                              "outside a `with` block of this frame is open")
    for manager in reversed(managers):
        manager.exit(tx)
    return managers


def _nested_codes(code: types.CodeType) -> set[types.CodeType]:
    """The code objects of the functions ``code`` defines (at any depth)."""
    out = set()
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out.add(const)
            out |= _nested_codes(const)
    return out


def _made_code(vt, fn) -> types.CodeType | None:
    """The code of a function made by the frame (this capture's, or received as made by
    the frame this resume function continues); None for other values."""
    if isinstance(vt, NestedUserFunctionVariable):
        return vt.code
    if isinstance(vt, UserFunctionVariable) and isinstance(vt.source, LocalSource):
        return resume.made_functions(fn).get(vt.source.local)
    return None


def _made_function(output: OutputGraph, value: types.FunctionType,
                   source) -> UserFunctionVariable:
    """A function the frame that broke made (new on each call), guarded by what the
    capture relies on: its code and its cells (the frame's, received as parameters, or
    fixed ones). Defaults and cell contents are guarded where they are read."""
    add = output.guards.add
    add(guards.type_match(source, types.FunctionType))
    add(guards.id_match(AttrSource(source, "__code__"), value.__code__))
    add(guards.id_match(AttrSource(source, "__globals__"), value.__globals__))
    for i, cell in enumerate(value.__closure__ or ()):
        cell_source = GetItemSource(AttrSource(source, "__closure__"), i)
        known = output.cells_by_id.get(id(cell))
        if known is not None and known.cell_source is not None:
            add(guards.same_object(cell_source, known.cell_source))
        else:
            add(guards.id_match(cell_source, cell))
    return UserFunctionVariable(value, source)


def _return_tail(capture: _Capture):
    def tail(cg: EntryCodegen) -> list[str]:
        return_expr = cg.reconstruct(capture.result)
        effects = capture.output.side_effects.codegen(cg)
        # list iterators positioned once their lists are replayed (LiveListIteratorVariable)
        return effects + cg.iterator_lines + [f"return {return_expr}"]
    return tail


def _break_entry(fn, arguments: dict, error: Unsupported, settings, miss,
                 callees: Callees) -> CacheEntry:
    """Capture again up to the instruction that broke; the entry runs it in Python and
    continues in resume functions (see ``graph_break.py``). Unsupported when splitting the
    frame there is not safe: the frame then runs eagerly."""
    reason = graph_break.BreakReason.from_error(error)
    try:
        capture = _capture(fn, arguments, break_at=error.break_step,
                           dynamic=settings.dynamic, seen=getattr(callees, "seen_sizes", None))
        tx = capture.tx
        if tx.break_index is None:
            raise Unsupported("capture did not reach the graph break again")
        inst = tx.instructions[tx.break_index]
        graph_break.check_breakable(tx, inst)
        graph_break.check_blocks(tx, inst)
        found = graph_break.emitter_for(inst.opname)
        if found is None:
            raise Unsupported(f"cannot run {inst.opname} at a graph break")
        entry = _build_entry(fn, capture, settings, miss,
                             _break_tail(fn, capture, inst, found, error.inlined, callees),
                             callees)
    except Unsupported as e:
        graph_break.record(dataclasses.replace(reason, frame_ran_eagerly=True,
                                               reason=f"{reason.reason}; {e.msg}"),
                           fn.__qualname__)
        raise Unsupported(f"{error.msg}, and the graph cannot break there: {e.msg}",
                          error.where) from None
    graph_break.record(reason, fn.__qualname__)
    return entry


def _break_tail(fn, capture: _Capture, inst, found, inlined: bool, callees: Callees):
    """Lines after the graph call: rebuild the live values, apply side effects, run the
    instruction, and call the resume function of each way it continues. Inside a ``try``
    or ``with`` block the instruction runs under ``try``: its exception resumes the frame at
    the block's handler, the one it reaches in eager (the handler's ``except`` clauses,
    ``finally`` body or ``__exit__`` then run in the resume function, and so do the blocks
    around it, whose handlers the resume code keeps)."""
    tx = capture.tx
    count, emit = found

    def call_resume(cg, target, stack, raised_at=None) -> str:
        # a for loop's iterator below the break, by tracker: locals naming it alias it
        on_stack = {id(vt): i for i, vt in enumerate(below[:len(stack)])
                    if isinstance(vt, ListIteratorVariable) and stack[i][0] == resume.ITERATOR}
        names, values, iterators = _live_locals(tx, target, cg, on_stack)
        code = resume.resume_code(tx.code, target, tuple(kind for kind, _ in stack),
                                  tuple(names), raised_at, tuple(iterators))
        made = {name: made_code for name in names
                if (made_code := _made_code(tx.symbolic_locals[name], fn)) is not None}
        wrapper = cg.const(callees.resume(resume.resume_function(code, fn, made)))
        args = ", ".join([e for _, e in stack if e is not None] + values + _cells(tx, cg))
        return f"return {wrapper}({args})"

    below: list[VariableTracker] = []

    def tail(cg: EntryCodegen) -> list[str]:
        n = count(tx, inst)
        below[:], operands = tx.stack[:len(tx.stack) - n], tx.stack[len(tx.stack) - n:]
        for vt in [*below, *tx.symbolic_locals.values()]:
            if isinstance(vt, ListIteratorVariable):   # passed by their items: see rebuild
                vt.passed_as_items = True
        below_items = [_stack_item(vt, cg) for vt in below]
        call_compiled = cg.const(callees.call) if inlined else None
        ctx = graph_break.EmitContext(tx, cg, operands, tx.break_index + 1, call_compiled)
        emitted = emit(ctx, inst)
        lines = capture.output.side_effects.codegen(cg)
        if capture.grad_mode_at_end != capture.output.initial_grad_mode:
            lines.insert(0, graph_break.grad_mode_line(cg, capture.grad_mode_at_end))
        replayed_at = len(lines)
        run_lines = emitted.lines
        if capture.reentered:   # the instruction runs inside the blocks the graph closed
            managers = ", ".join(m.reentry_text(cg) for m in capture.reentered)
            run_lines = [f"with {managers}:", *["    " + line for line in run_lines]]
        block = inst.exn_tab_entry
        if block is None:
            lines += run_lines
        else:
            exc = cg.fresh("___exc")
            handler_stack = below_items[:block.depth]
            if block.lasti:
                handler_stack.append((resume.LASTI, None))
            handler_stack.append((resume.VALUE, exc))
            handler = call_resume(cg, tx.index_of[id(block.target)], handler_stack,
                                  tx.break_index)
            # the handler runs outside this `except`: no exception context leaks into it
            lines += [f"{exc} = None", "try:", *["    " + line for line in run_lines],
                      "except BaseException as ___e:", f"    {exc} = ___e",
                      f"if {exc} is not None: {handler}"]
        for outcome in emitted.outcomes:
            if outcome.target is None:
                continue
            stack = below_items + [(resume.NULL, None) if e is None else (resume.VALUE, e)
                                   for e in outcome.pushed]
            call = call_resume(cg, outcome.target, stack)
            lines.append(f"if {outcome.when}: {call}" if outcome.when else call)
        # real iterators over dicts: made after the replay, before the instruction runs
        lines[replayed_at:replayed_at] = cg.iterator_lines
        return lines
    return tail


def _stack_item(vt: VariableTracker, cg: EntryCodegen) -> tuple[str, str | None]:
    """(how the resume prologue rebuilds it, the argument's expression) of a stack item."""
    if vt is NULL:
        return resume.NULL, None
    if isinstance(vt, CtxMethodVariable) and vt.name == "__exit__" and \
            isinstance(vt.ctx, GlobalContextVariable):   # entered again by the resume
        return resume.CONTEXT, vt.ctx.reentry_text(cg)
    if _passed_as_iterator(vt):   # a for loop's: its remaining items
        return resume.ITERATOR, _remaining_items(vt, cg)
    return resume.VALUE, cg.reconstruct(vt)


def _cells(tx, cg: EntryCodegen) -> list[str]:
    """The cells of the frame, for the resume function's cell parameters (each in a
    ``resume.CellRef``): made now (shared with the inner functions rebuilt for the resume;
    empty when unassigned at the break), or received as parameters."""
    original = resume.origin(tx.code)
    out = []
    for name in original.co_cellvars:
        if tx.code is not original:     # received: passed on
            out.append(cg.reconstruct(tx.symbolic_locals[resume.cell_param(name)]))
            continue
        vt = tx.cells.get(name)
        cell = cg.reconstruct(vt) if vt is not None else f"{cg.const(types.CellType)}()"
        out.append(f"{cg.const(resume.CellRef)}({cell}, {name!r})")
    return out


def _live_locals(tx, target: int, cg: EntryCodegen, on_stack: dict[int, int]
                 ) -> tuple[list[str], list[str], list[tuple]]:
    """(names, expressions) of the locals read after ``target`` and bound at the break
    (cells are passed on their own: ``_cells``), and the iterator locals (see
    ``resume.resume_code``): an iterator is passed as the tuple of its remaining items and
    made again by the resume's prologue, once however many names (locals, a ``for`` loop's
    stack item) it has, so advancing it through one name advances it through all."""
    live = livevars_at(tx.instructions, tx.instructions[target])
    # a cell's value lives in the cell (3.13 reads a cell for a closure with LOAD_FAST)
    cells = set(resume.cell_params(tx.code)) | set(resume.origin(tx.code).co_cellvars)
    names, values, iterators = [], [], []
    named: dict[int, str] = {}
    for name in tx.code.co_varnames:
        if name not in live or name not in tx.symbolic_locals or name in cells:
            continue
        value = tx.symbolic_locals[name]
        if value is NULL:
            continue
        if _passed_as_iterator(value):
            if id(value) in on_stack:
                iterators.append((name, "stack", on_stack[id(value)]))
                continue
            if id(value) in named:
                iterators.append((name, "local", named[id(value)]))
                continue
            named[id(value)] = name
            iterators.append((name, resume.ITERATOR, None))
            names.append(name)
            values.append(_remaining_items(value, cg))
            continue
        names.append(name)
        values.append(cg.load(value.source) if isinstance(value, _LazyLocal)
                      else cg.reconstruct(value))
    return names, values, iterators


def _passed_as_iterator(vt: VariableTracker) -> bool:
    return type(vt) is ListIteratorVariable or isinstance(
        vt, _LIVE_ITERATORS)


_LIVE_ITERATORS = (DictIteratorVariable, LazyIteratorVariable, LiveListIteratorVariable,
                   *GUARDED_ITERATORS)


def _remaining_items(vt: ListIteratorVariable, cg: EntryCodegen) -> str:
    """What the resume function makes the iterator from: the tuple of its remaining items,
    or, for one over a dict (live: values read when reached, size changes raise) or a list
    (live: an index into it), the real iterator over the real container where the frame's
    was (made once, after the mutations are replayed: ``cg.iterator_lines``)."""
    if isinstance(vt, _LIVE_ITERATORS):
        name = cg.iterator_names.get(id(vt))
        if name is None:
            name = cg.iterator_names[id(vt)] = cg.fresh("___it")
            made = vt.real_iterator(cg, resumed=True)
            cg.iterator_lines.append(f"{name} = {made}")
        return name
    items = [cg.reconstruct(v) for v in vt.items[vt.index:]]
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"


def _build_entry(fn, capture: _Capture, settings, miss,
                 tail: Callable[[EntryCodegen], list[str]], callees: Callees) -> CacheEntry:
    output = capture.output
    output.distinct_object_guards()
    cg = EntryCodegen(fn)
    cg.miss = miss
    cg.shape_text = lambda expr: output.symbolic.entry_text(expr, cg.load, cg.const)
    for slot, tensor in output.constant_tensor_slots().items():
        cg.consts[slot] = tensor
    for slot, module_globals in output.global_dicts.values():
        cg.consts[slot] = module_globals
    guard_list = list(output.guards)
    guard_lines = cg.guard_lines(guard_list, lambda g: "return ___MISS")
    cg.lines = []
    tail_lines = tail(cg)              # asks for the graph outputs it needs
    rebuild_lines, cg.lines = cg.lines, []
    out_nodes = cg.output_nodes
    output.symbolic.lift_input_symbols()
    gm = output.finish(out_nodes)
    output.symbolic.check_marks()
    has_ops = any(n.op.startswith("call_") for n in gm.graph.nodes)
    name = fn.__name__ if fn.__name__.isidentifier() else "compiled_frame"
    body: list[str] = []
    if has_ops or out_nodes:
        example_inputs = [inp.value for inp in output.graph_inputs()]
        logs.log("graph", "captured graph of %s:\n%s", fn.__qualname__, gm.code)
        ddp = output.ddp_module or getattr(callees, "ddp", None) or ddp_split.active_ddp()
        if ddp is not None:    # cut where DDP's gradient buckets end
            compiled = ddp_split.compile_for_ddp(gm, example_inputs,
                                                 functools.partial(_call_backend, settings),
                                                 ddp, fn.__qualname__,
                                                 output.initial_grad_mode)
        else:
            compiled = _call_backend(settings, gm, example_inputs)
        if not callable(compiled):
            raise TypeError(f"backend {settings.backend!r} returned {type(compiled).__name__}, "
                            f"not a callable")
        metrics.counters["frontend"]["graphs"] += 1
        gm.meta["ember_dynamic_dims"] = output.symbolic.live_dynamic_dims()
        graph_break.notify("graph", gm)
        graph_name = cg.const(compiled)
        args_text = ", ".join(_graph_argument(cg, inp) for inp in output.graph_inputs())
        body += cg.lines + [f"___out = {graph_name}({args_text})"]
    body += rebuild_lines + tail_lines
    # the shape guards last: the backend may have added some while compiling
    shape_guards = output.symbolic.shape_guards()
    guard_list += shape_guards
    if shape_guards:
        guard_lines += cg.guard_lines([merged_guard(shape_guards)], lambda g: "return ___MISS")
    src, run = cg.build(guard_lines, body, name)
    cg.shape_text = None     # the entry keeps cg (its diagnostic twin), not the capture

    def diagnostic_twin():
        """Same guards, answers which one failed."""
        diag = EntryCodegen(fn)
        diag.miss = "a guard expression raised (a value changed type or lost an attribute)"
        diag.consts = dict(cg.consts)
        diag._const_ids = dict(cg._const_ids)
        diag_lines = diag.guard_lines(guard_list, lambda g: f"return {g.describe()!r}")
        return diag.build(diag_lines, ["return None"], name + "_check")[1]

    _log_and_dump(fn, gm, src, guard_list, has_ops)
    return CacheEntry(run, diagnostic_twin, guard_list, gm if has_ops else None, src)


def _call_backend(settings, gm: torch.fx.GraphModule, example_inputs: list):
    if settings.options:   # the "ember" backend: its options as keywords
        return settings.backend(gm, example_inputs, **settings.options)
    return settings.backend(gm, example_inputs)     # any backend: the two-argument contract


def _graph_argument(cg: EntryCodegen, inp) -> str:
    if inp.size_of is not None:     # a size symbol: the int read from its input
        return property_text(cg.load(property_source(inp.size_of)), inp.size_of)
    value = cg.load(inp.source)
    if inp.from_float:
        return f"{cg.const(torch.scalar_tensor)}({value}, dtype={cg.const(torch.float64)})"
    return value


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
