"""Context managers the evaluator understands: grad mode (``torch.no_grad()`` and friends,
also as decorators), autocast and inference mode, profiler ranges, and the objects that carry
an open block across a graph break into the resume function.

Profiler ranges (``torch.autograd.profiler.record_function``, ``torch.profiler.record_function``,
``torch.autograd.profiler.emit_nvtx``, ``emit_itt``) are captured as no-ops: the graph has no
node for them, so a profiler shows no such range inside a compiled graph. Recording them would put a
``ScriptObject`` handle into the graph, and ops inside one graph are fused and reordered
anyway, so the range would not mark what it marks in eager mode; DDP's forward opens one."""
from __future__ import annotations

import contextlib
import types

import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import ConstantVariable, VariableTracker


class ContextManagerVariable(VariableTracker):
    """A ``with`` target the evaluator understands. ``enter``/``exit`` act at capture time
    and record what the compiled graph must do."""

    def enter(self, tx) -> VariableTracker:
        raise NotImplementedError

    def exit(self, tx) -> None:
        raise NotImplementedError

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        if name == "__enter__":
            return CtxMethodVariable(self, self.enter, name)
        if name == "__exit__":
            return CtxMethodVariable(self, lambda tx: (self.exit(tx), ConstantVariable(None))[1],
                                     name)
        return super().var_getattr(tx, name)


class CtxMethodVariable(VariableTracker):
    """``ctx.__enter__`` or ``ctx.__exit__`` of a context manager the evaluator understands
    (a ``with`` block keeps the exit on the stack until the block ends)."""

    def __init__(self, ctx, fn, name: str):
        super().__init__()
        self.ctx = ctx
        self.fn = fn
        self.name = name

    def call_function(self, tx, args, kwargs):
        return self.fn(tx)

    def rebuild(self, cg):
        if isinstance(self.ctx, GradModeVariable) and self.name == "__exit__":
            return cg.const(GradModeExit(self.ctx.restore_mode()))
        if isinstance(self.ctx, NoOpContextVariable) and self.name == "__exit__":
            return cg.const(PROFILER_RANGE_EXIT)
        return super().rebuild(cg)


class GradModeVariable(ContextManagerVariable):
    """``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(b)``: the graph
    gets ``torch._C._set_grad_enabled`` nodes, and capture follows the same mode."""

    def __init__(self, mode: bool, applied_on_create: bool = False,
                 before_create: bool | None = None):
        super().__init__()
        self.mode = mode
        self.prior: list[bool | None] = []
        self.before_create = before_create
        if applied_on_create:
            self.prior.append(None)  # set_grad_enabled(...) already took effect

    def python_type(self):
        return torch.autograd.grad_mode.no_grad if not self.mode else \
            torch.autograd.grad_mode.enable_grad

    def enter(self, tx):
        if self.prior and self.prior[-1] is None:
            return ConstantVariable(None)
        self.prior.append(torch.is_grad_enabled())
        tx.output.set_grad_enabled(self.mode)
        return ConstantVariable(None)

    def exit(self, tx):
        mode = self.restore_mode()
        self.prior.pop()
        tx.output.set_grad_enabled(mode)

    def restore_mode(self) -> bool:
        """The grad mode the innermost open block of this manager restores on exit."""
        prior = self.prior[-1]
        return self.before_create if prior is None else prior

    def call_function(self, tx, args, kwargs):
        # used as a decorator: @torch.no_grad() def f(...)
        if self.prior or self.before_create is not None or len(args) != 1 or kwargs:
            raise Unsupported("set_grad_enabled(...) as a decorator inside a compiled region")
        return GradModeFunctionVariable(args[0], self.mode)

    def rebuild(self, cg):
        if self.prior or self.before_create is not None:
            return super().rebuild(cg)     # an open block or set_grad_enabled: not a value
        return cg.const(torch.enable_grad() if self.mode else torch.no_grad())


class DecoratedFunctionVariable(VariableTracker):
    """A function decorated inside the frame with a context manager: a function whose
    metadata (``__name__``, ``__wrapped__``...) is the decorated one's."""

    def __init__(self, fn: VariableTracker):
        super().__init__()
        self.fn = fn

    def python_type(self):
        return types.FunctionType

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__wrapped__"):
            return self.fn if name == "__wrapped__" else tx.getattr(self.fn, name)
        return super().var_getattr(tx, name)


class GradModeFunctionVariable(DecoratedFunctionVariable):
    """A function decorated inside the frame with ``@torch.no_grad()`` or
    ``@torch.enable_grad()``: a call runs the function in that mode, recorded in the graph
    like a ``with`` block around it."""

    def __init__(self, fn: VariableTracker, mode: bool):
        super().__init__(fn)
        self.mode = mode

    def call_function(self, tx, args, kwargs):
        prior = torch.is_grad_enabled()
        tx.output.set_grad_enabled(self.mode)
        result = tx.call(self.fn, args, kwargs)
        tx.output.set_grad_enabled(prior)
        return result

    def rebuild(self, cg):
        manager = torch.enable_grad() if self.mode else torch.no_grad()
        return f"{cg.const(manager)}({cg.reconstruct(self.fn)})"


class GlobalContextVariable(ContextManagerVariable):
    """A ``torch.autocast(...)`` or ``torch.inference_mode(...)`` block. Entered for real
    while capture is inside it (fake ops then see autocast's casts), and recorded in the
    graph as the enter/exit calls TorchDynamo also records (``torch.amp._enter_autocast``),
    so the compiled graph switches the same state around the same ops."""

    def __init__(self, enter_fn, exit_fn, args: tuple, py_type: type):
        super().__init__()
        self.enter_fn, self.exit_fn, self.args = enter_fn, exit_fn, args
        self.py_type = py_type
        self.open: list[tuple[object, object]] = []     # (real context, its graph node)

    def python_type(self):
        return self.py_type

    def enter(self, tx):
        real = tx.output.enter_global_context(self.enter_fn, self.exit_fn, self.args, self)
        node = tx.output.graph.call_function(self.enter_fn, self.args)
        self.open.append((real, node))
        return ConstantVariable(None)

    def exit(self, tx):
        real, node = self.open.pop()
        tx.output.exit_global_context(real)
        tx.output.graph.call_function(self.exit_fn, (node,))

    def call_function(self, tx, args, kwargs):
        raise Unsupported(f"{self.py_type.__name__} as a decorator inside a compiled region")

    def reentry_text(self, cg) -> str:
        """An expression making a :class:`GlobalContextReentry` of this block, for the
        entry of a graph break inside it."""
        return f"{cg.const(GlobalContextReentry)}({cg.const(self.py_type)}, {cg.const(self.args)})"


# py_type of a GlobalContextVariable -> (its graph's enter function, exit function)
GLOBAL_CONTEXTS = {
    torch.autocast: (torch.amp.autocast_mode._enter_autocast,
                     torch.amp.autocast_mode._exit_autocast),
    torch.inference_mode: (torch.autograd.grad_mode._enter_inference_mode,
                           torch.autograd.grad_mode._exit_inference_mode),
}


class GlobalContextReentry:
    """An autocast or inference-mode block open at a graph break, handed to the resume
    function, whose prologue enters it again (``BEFORE_WITH``) so that its ``__exit__``
    lies on the stack where the block left it. The graph before the break closed the block
    and the entry ran the instruction inside a real one; the resume function's capture
    models it in its own graph again. Run for real (a resume that runs eagerly), it enters
    a fresh ``py_type(*args)``."""
    __slots__ = ("py_type", "args", "_real")

    def __init__(self, py_type: type, args: tuple):
        self.py_type, self.args = py_type, args
        self._real: list = []

    def __enter__(self):
        real = self.py_type(*self.args)
        self._real.append(real)
        return real.__enter__()

    def __exit__(self, *exc_info):
        return self._real.pop().__exit__(*exc_info)

    def __repr__(self):
        return f"GlobalContextReentry({self.py_type.__name__}{self.args!r})"


class GradModeExit:
    """The exit of an open grad-mode ``with`` block, handed to a resume function after a
    graph break (the block's ``__exit__`` on the stack): restores grad mode to ``mode``."""
    __slots__ = ("mode",)

    def __init__(self, mode: bool):
        self.mode = mode

    def __call__(self, *exc_info) -> bool:
        torch._C._set_grad_enabled(self.mode)
        return False    # never swallows the exception

    def __repr__(self):
        return f"GradModeExit({self.mode})"


class GradModeExitVariable(VariableTracker):
    """A :class:`GradModeExit` read from a resume function's arguments."""

    def __init__(self, mode: bool, source=None):
        super().__init__(source)
        self.mode = mode

    def python_type(self):
        return GradModeExit

    def call_function(self, tx, args, kwargs):
        tx.output.set_grad_enabled(self.mode)
        return ConstantVariable(False)


class NoOpContextVariable(ContextManagerVariable):
    """A context manager whose enter and exit the graph does not need: profiler ranges (see
    the module docstring) and DDP's ``_inside_ddp_forward`` (it marks the DDP whose module
    runs, for graph splitting at its buckets, which capture notes instead: ddp_split.py).
    ``ctor`` is ``(args, kwargs)`` as constants when the manager was made during capture (to
    rebuild it), else None."""

    def __init__(self, py_type: type, ctor: tuple | None, source=None):
        super().__init__(source)
        self.py_type = py_type
        self.ctor = ctor

    def python_type(self):
        return self.py_type

    def enter(self, tx):
        return ConstantVariable(None)

    def exit(self, tx):
        return None

    def rebuild(self, cg):
        if self.ctor is None:
            return super().rebuild(cg)
        args, kwargs = self.ctor
        parts = [cg.const(a) for a in args] + [f"{k}={cg.const(v)}" for k, v in kwargs.items()]
        return f"{cg.const(self.py_type)}({', '.join(parts)})"


class ProfilerRangeVariable(NoOpContextVariable):
    """A profiler range (``record_function(name)``, ``emit_nvtx()``): a no-op, also as a
    decorator."""

    def enter(self, tx):
        return self    # record_function's and emit_nvtx's __enter__ return the manager

    def var_getattr(self, tx, name):
        if name == "_recreate_cm":      # contextlib.ContextDecorator's wrapper asks for it
            return CtxMethodVariable(self, lambda tx: self, name)
        return super().var_getattr(tx, name)

    def call_function(self, tx, args, kwargs):
        # used as a decorator: @record_function("name") def f(...)
        if len(args) != 1 or kwargs:
            raise Unsupported(f"calling a {self.py_type.__name__} with these arguments")
        return ProfiledFunctionVariable(args[0], self)


class ProfiledFunctionVariable(DecoratedFunctionVariable):
    """A function decorated inside the frame with a profiler range: a call runs the
    function (the range is a no-op in the graph); rebuilt decorated."""

    def __init__(self, fn: VariableTracker, manager: ProfilerRangeVariable):
        super().__init__(fn)
        self.manager = manager

    def call_function(self, tx, args, kwargs):
        return tx.call(self.fn, args, kwargs)

    def rebuild(self, cg):
        return f"{cg.reconstruct(self.manager)}({cg.reconstruct(self.fn)})"


class ProfilerRangeExit:
    """The exit of an open no-op block (a profiler range's) handed to a resume function
    after a graph break: nothing to close."""
    __slots__ = ()

    def __call__(self, *exc_info) -> bool:
        return False

    def __repr__(self):
        return "ProfilerRangeExit()"


PROFILER_RANGE_EXIT = ProfilerRangeExit()


class ProfilerRangeExitVariable(VariableTracker):
    """A :class:`ProfilerRangeExit` read from a resume function's arguments."""

    def python_type(self):
        return ProfilerRangeExit

    def call_function(self, tx, args, kwargs):
        return ConstantVariable(False)


# the profiler context managers captured as no-ops (torch.profiler.record_function is the
# same class as torch.autograd.profiler's)
PROFILER_RANGES = (torch.autograd.profiler.record_function, torch.autograd.profiler.emit_nvtx,
                   torch.autograd.profiler.emit_itt)


def _ddp_inside_forward():
    """``DistributedDataParallel._inside_ddp_forward`` as stored on the class, or None."""
    if not torch.distributed.is_available():
        return None
    return vars(torch.nn.parallel.DistributedDataParallel).get("_inside_ddp_forward")


# methods of modules whose call makes a no-op block: DDP marks the module it runs for
# graph splitting at its buckets (capture notes the DDP instead: NoOpContextMethodVariable)
NO_OP_CONTEXT_METHODS = frozenset(f for f in (_ddp_inside_forward(),) if f is not None)


class NoOpContextMethodVariable(VariableTracker):
    """A bound method in ``NO_OP_CONTEXT_METHODS``: called, a no-op block, and the capture
    notes the DDP whose forward it is in (its graph is cut at that DDP's buckets)."""

    def __init__(self, fn, owner):
        super().__init__()
        self.fn = fn
        self.owner = owner

    def call_function(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported(f"{self.fn.__qualname__} with arguments")
        tx.output.ddp_module = self.owner
        return NoOpContextVariable(contextlib._GeneratorContextManager, None)
