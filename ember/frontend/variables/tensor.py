"""Tensors during capture: an FX node plus its fake value (metadata only)."""
from __future__ import annotations

import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import BoundMethodVariable, ConstantVariable, VariableTracker
from ember.frontend.variables.storage import UntypedStorageVariable

# Attribute reads answered from the fake tensor's metadata.
_CONSTANT_ATTRS = {
    "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu", "is_sparse", "layout",
    "is_quantized", "is_meta", "is_leaf", "is_nested", "is_mkldnn", "itemsize", "nbytes",
}
# Methods answered from metadata (no graph node).
_CONSTANT_METHODS = {
    "dim", "ndimension", "numel", "nelement", "is_contiguous", "is_floating_point",
    "is_complex", "element_size", "get_device", "is_signed", "stride", "storage_offset",
    "is_inference", "has_names",
}
# Attributes that are tensors computed from the tensor: graph nodes.
_TENSOR_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}
_DATA_DEPENDENT_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__",
                           "__index__", "nonzero", "data_ptr", "untyped_storage",
                           "storage", "backward", "register_hook", "retain_grad"}


class TensorVariable(VariableTracker):
    def __init__(self, node: torch.fx.Node, fake: torch.Tensor, source=None):
        super().__init__(source)
        self.node = node
        self.fake = fake

    def python_type(self):
        # what eager's tensor is (never the fake's own class): an input's type, recorded when
        # it was read, else Tensor (a Parameter made for real during capture keeps its type)
        if self.source is None and isinstance(self.fake, torch.nn.Parameter):
            return torch.nn.Parameter
        return self.fake_python_type

    fake_python_type = torch.Tensor

    def truthy(self, tx):
        raise Unsupported("control flow on a tensor's value (data-dependent)")

    def rebuild(self, cg):
        return f"___out[{cg.graph_output(self.node)}]"

    def var_getattr(self, tx, name):
        if name == "__class__":
            return tx.wrap(self.python_type(), None)
        if name in ("__module__", "__doc__"):     # class attributes seen through the instance
            return ConstantVariable(getattr(self.python_type(), name))
        if name in ("shape",):
            return tx.size_variable(self.fake.shape)
        if name in _CONSTANT_ATTRS:
            return ConstantVariable(getattr(self.fake, name))
        if name in _TENSOR_ATTRS:
            import builtins
            return tx.output.call_function(builtins.getattr, [self, ConstantVariable(name)], {})
        if name in ("grad", "data", "grad_fn", "_version", "_base"):
            raise Unsupported(f"tensor attribute .{name} inside a compiled region")
        if hasattr(torch.Tensor, name):
            return TensorMethodVariable(self, name)
        raise Unsupported(f"AttributeError: 'Tensor' object has no attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        if name == "size":
            const_args = [a.as_python_constant() for a in args]
            size = self.fake.size(*const_args)
            return tx.size_variable(size) if isinstance(size, torch.Size) \
                else tx.wrap_constant(size)
        if name in _CONSTANT_METHODS:
            const_args = [a.as_python_constant() for a in args]
            const_kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
            value = getattr(self.fake, name)(*const_args, **const_kwargs)
            return tx.wrap_constant(value)
        if name == "type" and not args and not kwargs:
            return ConstantVariable(self.fake.type())
        if name == "__len__":
            if self.fake.dim() == 0:
                raise Unsupported("len() of a 0-d tensor")
            return tx.wrap_constant(self.fake.shape[0])
        if name == "numpy" and not args:
            # local: an ndarray tracker wraps a tensor tracker (numpy imports this module)
            from ember.frontend.variables.numpy import tensor_to_ndarray
            return tensor_to_ndarray(tx, self, args, kwargs)
        if name == "untyped_storage" and not args and not kwargs:
            return UntypedStorageVariable(self)
        if name in _DATA_DEPENDENT_METHODS:
            raise Unsupported(f"Tensor.{name}() reads tensor data (data-dependent)")
        return tx.output.call_method(name, [self, *args], kwargs)

    def unpack(self, tx):
        if self.fake.dim() == 0:
            raise Unsupported("iterating over a 0-d tensor")
        import operator
        return [tx.output.call_function(operator.getitem, [self, ConstantVariable(i)], {})
                for i in range(self.fake.shape[0])]

    def __repr__(self):
        return f"TensorVariable({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"


class TensorMethodVariable(BoundMethodVariable):
    """``tensor.method`` before it is called."""

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def var_getattr(self, tx, name):
        if name == "__name__":
            return ConstantVariable(self.name)
        if name == "__qualname__":   # a bound method's: its object's class, then the name
            return ConstantVariable(f"{self.obj.python_type().__qualname__}.{self.name}")
        if name == "__self__":
            return self.obj
        return super().var_getattr(tx, name)
