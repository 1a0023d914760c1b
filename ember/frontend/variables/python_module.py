"""Python modules read during capture (``math``, ``torch.nn.functional``, user modules)."""
from __future__ import annotations

import types

from ember.frontend.exc import Unsupported
from ember.frontend.source import AttrSource
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.torch_state import read_state


TRUSTED_MODULE_PREFIXES = ("torch", "math", "operator", "builtins", "functools", "itertools",
                           "collections", "typing", "numbers", "enum", "dataclasses",
                           "warnings", "inspect", "types", "abc", "copy", "einops")


class PythonModuleVariable(VariableTracker):
    def __init__(self, module: types.ModuleType, source=None):
        super().__init__(source)
        self.value = module

    def as_python_constant(self):
        return self.value

    def python_type(self):
        return types.ModuleType

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(f"AttributeError: {e}") from None
        if self.value.__name__.startswith("torch.backends."):
            # flags users switch between calls (cudnn.enabled, allow_tf32): guarded reads
            return read_state(tx, self.value, name, f"{self.value.__name__}.{name}")
        trusted = self.value.__name__.split(".")[0] in TRUSTED_MODULE_PREFIXES
        # Library modules are assumed not to be monkeypatched between calls.
        source = None if trusted or self.source is None else AttrSource(self.source, name)
        return tx.wrap(value, source)

    def __repr__(self):
        return f"PythonModuleVariable({self.value.__name__})"
