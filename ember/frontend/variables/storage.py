"""Tensor storages (``t.untyped_storage()``) during capture.

A storage is memory, not a tensor value: the graph has no node for it. Capture keeps which
tensor a storage came from (or its source, for a storage the frame received, e.g. a resume
function's local) and answers its size queries (``nbytes()``, ``size()``, ``len()``) as
constants guarded by their answer, where the storage can be read when guards run: that of a
graph input, or a storage from a source. An intermediate's storage is whatever the backend
allocates, so its size, and every other use of any storage (``data_ptr()``, writes,
``is`` between storages of different tensors), breaks the graph: the instruction runs in
Python on the real storage, which the entry reads again from its tensor (a tensor's
storage object is cached on its memory, so ``t.untyped_storage()`` is the same object
each time, as eager's).
"""
from __future__ import annotations

import torch

from ember.frontend import guards
from ember.frontend.exc import Unsupported
from ember.frontend.source import ConstantSource
from ember.frontend.variables.base import BoundMethodVariable, ConstantVariable, VariableTracker

# methods answered with the storage's size in bytes
_SIZE_QUERIES = ("nbytes", "size", "__len__")


def _storage_nbytes(tensor: torch.Tensor) -> int:
    """What a guard on a tensor's storage size reads."""
    return tensor.untyped_storage().nbytes()


class UntypedStorageVariable(VariableTracker):
    """The storage of ``tensor`` (a TensorVariable), or the storage ``real`` read from
    ``source``."""

    def __init__(self, tensor=None, source=None, real: torch.UntypedStorage | None = None):
        super().__init__(source)
        self.tensor = tensor
        self.real = real

    def python_type(self):
        return torch.UntypedStorage

    def rebuild(self, cg):
        return f"{cg.reconstruct(self.tensor)}.untyped_storage()"

    def nbytes(self, tx) -> int:
        if self.tensor is None:
            n = self.real.nbytes()
            tx.output.guards.add(guards.call_result_match(
                self.source, torch.UntypedStorage.nbytes, (), n))
            return n
        source = self.tensor.source
        if source is None:
            raise Unsupported("the size of an intermediate tensor's storage (the backend "
                              "allocates it)")
        n = self.tensor.fake.untyped_storage().nbytes()
        if not isinstance(source, ConstantSource):
            tx.output.guards.add(guards.call_result_match(source, _storage_nbytes, (), n))
        return n

    def truthy(self, tx):
        return self.nbytes(tx) > 0

    def var_getattr(self, tx, name):
        if name == "device" and self.tensor is not None:
            return ConstantVariable(self.tensor.fake.device)
        if name in _SIZE_QUERIES or name == "element_size":
            return BoundMethodVariable(self, name)
        raise Unsupported(f"UntypedStorage.{name} inside a compiled region")

    def call_method(self, tx, name, args, kwargs):
        if name in _SIZE_QUERIES and not args and not kwargs:
            return ConstantVariable(self.nbytes(tx))
        if name == "element_size" and not args and not kwargs:
            return ConstantVariable(1)
        raise Unsupported(f"UntypedStorage.{name}() inside a compiled region")

    def __repr__(self):
        return f"UntypedStorageVariable({self.tensor if self.tensor is not None else self.source})"


def same_storage(a: VariableTracker, b: VariableTracker) -> bool:
    """``a is b`` where one side is a storage: known when both are one tensor's or one
    source's; a storage is never an object of another kind. Storages of different tensors
    may be one (views share it, and so may inputs): that is decided in Python."""
    if not (isinstance(a, UntypedStorageVariable) and isinstance(b, UntypedStorageVariable)):
        return False
    if a.tensor is not None and b.tensor is not None and a.tensor.fake is b.tensor.fake:
        return True
    if a.tensor is None and b.tensor is None and a.source == b.source:
        return True
    raise Unsupported("whether two tensors share one storage (an identity test of storages "
                      "of different tensors)")
