"""Floats a resume function receives, passed to its graph as inputs instead of guarded.

A graph break at ``s = loss.item()`` hands ``s`` to the resume function. Guarding on its
exact value would recompile the resume function for every value. A :class:`FloatInputVariable`
is a constant whose value is read (and then guarded, ``CONSTANT_MATCH``) only when capture
really needs it: control flow, Python arithmetic, an argument of anything but the ops below.

Used directly as the scalar operand of a pointwise arithmetic or comparison op with a tensor
(``x * s``, ``s - x``, ``torch.add(x, s)``, ``x.div_(s)``), it is instead a graph input: the
entry passes ``torch.scalar_tensor(s, dtype=float64)`` and the graph converts it to the dtype
that makes the op compute what eager computes with the Python float:

- a float64 tensor operand: float64 (eager computes with the double itself);
- float32/float16/bfloat16: float32 (eager casts the double to the float op-math type;
  the 0-d float32 tensor is a CPU scalar of the same value, and a 0-d tensor does not change
  the result dtype of a tensor of its category);
- integer and bool tensors: the default dtype (eager's result dtype for int tensor x float).

Complex tensors and every other use specialise the value.
"""
from __future__ import annotations

import operator

import torch

from ember.frontend import guards
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.tensor import TensorVariable

# pointwise ops whose float operand may be a 0-d tensor: operator functions and torch
# functions (the tensor and the float positional, in either order), and Tensor methods
_OPERATOR_TARGETS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.iadd,
    operator.isub, operator.imul, operator.itruediv, operator.lt, operator.le, operator.gt,
    operator.ge, operator.eq, operator.ne,
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.div,
    torch.true_divide, torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne,
    torch.maximum, torch.minimum,
}
_METHOD_TARGETS = {"add", "sub", "subtract", "mul", "multiply", "div", "true_divide", "add_",
                   "sub_", "mul_", "div_", "__add__", "__radd__", "__sub__", "__rsub__",
                   "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "lt", "le", "gt",
                   "ge", "eq", "ne"}


class FloatInputVariable(ConstantVariable):
    """A float parameter of a resume function: a graph input where it is a tensor op's
    scalar operand, a guarded constant once anything reads ``value``."""

    def __init__(self, value: float, source, output):
        VariableTracker.__init__(self, source)
        self._value = value
        self._output = output
        self.specialized = False
        self._node = None                                  # the float64 0-d graph input
        self._converted: dict[torch.dtype, VariableTracker] = {}

    @property
    def value(self) -> float:
        if not self.specialized:
            self.specialized = True
            self._output.guards.add(guards.constant_match(self.source, self._value))
        return self._value

    def reconstruct(self, cg):
        return cg.load(self.source)

    def as_tensor(self, dtype: torch.dtype) -> VariableTracker:
        """The value as a 0-d tensor of ``dtype`` in the graph."""
        found = self._converted.get(dtype)
        if found is None:
            if self._node is None:
                self._node = self._output.add_scalar_input(
                    torch.scalar_tensor(self._value, dtype=torch.float64), self.source)
            found = self._node if dtype == torch.float64 else self._output.call_method(
                "to", [self._node, ConstantVariable(dtype)], {})
            self._converted[dtype] = found
        return found

    def __repr__(self):
        return f"FloatInputVariable({self._value!r} from {self.source.name()})"


def _scalar_dtype(tensor_dtype: torch.dtype) -> torch.dtype | None:
    if tensor_dtype == torch.float64:
        return torch.float64
    if tensor_dtype.is_floating_point:
        return torch.float32
    if tensor_dtype.is_complex:
        return None
    return torch.get_default_dtype()


def scalar_operands(kind: str, target, args: list) -> list:
    """``args`` with an unspecialised float operand of a supported op between one tensor
    and it replaced by the float as a 0-d tensor (see the module docstring)."""
    floats = [i for i, a in enumerate(args)
              if type(a) is FloatInputVariable and not a.specialized]
    if not floats:
        return args
    supported = (target in _METHOD_TARGETS if kind == "call_method" else
                 target in _OPERATOR_TARGETS)
    if not supported or len(args) != 2 or len(floats) != 1:
        return args
    i = floats[0]
    other = args[1 - i]
    if not isinstance(other, TensorVariable):
        return args
    dtype = _scalar_dtype(other.fake.dtype)
    if dtype is None:
        return args
    out = list(args)
    out[i] = args[i].as_tensor(dtype)
    return out


def identity_key(vt: VariableTracker):
    """What ``vt`` is the same object as, during capture (the ``is`` test of
    ``InstructionTranslator.is_same_object``): the real object, a tensor's fake, else the
    tracker of an object made during capture."""
    if isinstance(vt, ConstantVariable):
        return ("__object__", id(vt.value))
    if isinstance(vt, TensorVariable):
        return ("__tensor__", id(vt.fake))
    value = getattr(vt, "value", None)
    if value is not None:
        return ("__object__", id(value))
    return ("__tracker__", id(vt))


class IdVariable(VariableTracker):
    """``id(obj)``: an opaque integer during capture. It answers what ``id`` is used for in
    code that can be traced (``copy.deepcopy``'s memo, identity-keyed caches): equality with
    other ids, and use as a dict key, both decided by which object it names. It is never a
    Python constant, so it is not folded into arithmetic nor baked into the generated code:
    where it is live after the graph it is computed again, ``id(<the object>)``, and the
    object is read from its source or is the one rebuilt object, so the value is the real one
    (no guard needed). ``of`` keeps the object's tracker alive, so a key is not reused by
    another object during capture, as ``id`` promises for objects alive at the same time."""

    def __init__(self, of: VariableTracker):
        super().__init__(None)
        self.of = of
        self.key = identity_key(of)

    def python_type(self):
        return int

    def truthy(self, tx):
        return True     # no object has id 0

    def reconstruct(self, cg):
        return f"id({cg.reconstruct(self.of)})"

    def __repr__(self):
        return f"IdVariable({self.of!r})"
