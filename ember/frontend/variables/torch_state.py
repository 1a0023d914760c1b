"""torch's process-wide state read by user and library code: backend flags
(``torch.backends.cudnn.enabled``, ``torch.backends.cuda.matmul.allow_tf32``), the
distributed default group, the onnx exporter's state, autograd engine objects.

Each read is answered at capture and guarded, so a later change (a flag switched between
calls, ``init_process_group``) recompiles instead of reusing a stale answer. The objects
that hold such state are opaque: reading their attributes is fine, calling their methods
(``queue_callback`` on the autograd engine) breaks the graph with the method's name.
"""
from __future__ import annotations

import functools

import torch

from ember.frontend import guards
from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import ConstantVariable, VariableTracker, is_constant_value
from ember.frontend.variables.handlers import HandlerFunctionVariable

# where the types of objects holding torch's global state live
_STATE_MODULES = ("torch.backends", "torch._C", "torch.onnx", "torch.distributed",
                  "torch.autograd")


def is_torch_state_object(value) -> bool:
    typ = type(value)
    return typ.__module__.startswith(_STATE_MODULES) and not isinstance(
        value, (torch.Tensor, torch.nn.Module, type)) and not callable(value)


def read_state(tx, owner, name: str, what: str) -> VariableTracker:
    """``owner.name`` read now; guarded on its value (constants) or identity (objects)."""
    try:
        value = getattr(owner, name)
    except Exception as e:   # noqa: BLE001 - a property of global state may raise anything
        raise Unsupported(f"{type(e).__name__} reading {what}: {e}") from None
    read = functools.partial(getattr, owner, name)
    if is_constant_value(value):
        tx.output.guards.add(guards.state_read_match(what, read, value))
        return ConstantVariable(value)
    if is_torch_state_object(value):
        tx.output.guards.add(guards.state_read_match(what, read, value, identity=True))
        return TorchStateObjectVariable(value, what)
    return tx.wrap(value, None)


class TorchStateObjectVariable(VariableTracker):
    """An object of torch's global state (``torch.backends.cuda.matmul``, a process group,
    the autograd engine): attributes are read and guarded, methods break the graph."""

    def __init__(self, value, what: str, source=None):
        super().__init__(source)
        self.value = value
        self.what = what

    def python_type(self):
        return type(self.value)

    def truthy(self, tx):
        return bool(self.value)

    def var_getattr(self, tx, name):
        attr = getattr(type(self.value), name, None)
        if callable(attr) and not isinstance(attr, property):
            what = f"{self.what}.{name}"

            def refuse(tx, args, kwargs):
                raise Unsupported(f"call to {what}(), a method of torch's "
                                  f"{type(self.value).__name__} (global state)")
            return HandlerFunctionVariable(getattr(self.value, name), refuse)
        return read_state(tx, self.value, name, f"{self.what}.{name}")

    def __repr__(self):
        return f"TorchStateObjectVariable({self.what})"
