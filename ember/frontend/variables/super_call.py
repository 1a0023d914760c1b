"""``super()``: attribute lookup that starts after a class in the object's MRO."""
from __future__ import annotations

import types

import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables.attribute_lookup import builtin_method
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.functions import (PartialVariable, UserFunctionVariable,
                                                UserMethodVariable)
from ember.frontend.variables.modules import (MODULE_CALL_IMPL, MODULE_GETATTR,
                                              ModuleCallVariable,
                                              ModuleGetattrVariable, NNModuleVariable,
                                              NewModuleVariable, is_module_call)
from ember.frontend.variables.user_defined import UserDefinedClassVariable


class SuperVariable(VariableTracker):
    def __init__(self, cls: type, obj: VariableTracker):
        super().__init__()
        self.cls = cls
        self.obj = obj

    def var_getattr(self, tx, name):
        obj_type = self.obj.python_type()
        if isinstance(self.obj, UserDefinedClassVariable):
            obj_type = self.obj.value
        mro = obj_type.__mro__
        start = mro.index(self.cls) + 1 if self.cls in mro else len(mro)
        for klass in mro[start:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if klass is object and name == "__init__":
                    return _NoOpVariable()
                if klass is torch.nn.Module and name == "__init__" and \
                        isinstance(self.obj, NewModuleVariable):
                    return _NoOpVariable()   # create_module already ran it for real
                if is_module_call(attr) and isinstance(self.obj, NNModuleVariable):
                    return ModuleCallVariable(self.obj, impl=attr is MODULE_CALL_IMPL)
                if attr is MODULE_GETATTR and isinstance(self.obj, NNModuleVariable):
                    return ModuleGetattrVariable(self.obj)
                if isinstance(attr, types.FunctionType):
                    return UserMethodVariable(UserFunctionVariable(attr), self.obj)
                if isinstance(attr, classmethod):
                    return UserMethodVariable(UserFunctionVariable(attr.__func__),
                                              tx.wrap(obj_type, None))
                if isinstance(attr, staticmethod):
                    return UserFunctionVariable(attr.__func__)
                if isinstance(attr, property) and attr.fget is not None:
                    return tx.wrap(attr.fget, None).call_function(tx, [self.obj], {})
                if klass is torch.nn.Module and name == "__init__":
                    raise Unsupported("nn.Module.__init__ inside a compiled region")
                real = builtin_method(klass, name, attr, self.obj)
                if real is not None:
                    return real
                if attr in _OBJECT_ATTRIBUTE_SLOTS:
                    return PartialVariable(tx.wrap(attr, None), [self.obj], {})
                return tx.wrap(attr, None)
        raise Unsupported(f"super().{name} not found")


_OBJECT_ATTRIBUTE_SLOTS = (object.__getattribute__, object.__setattr__, object.__delattr__)


class _NoOpVariable(VariableTracker):
    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)
