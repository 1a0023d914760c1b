"""Builtins that ask about types and attributes: ``isinstance``, ``issubclass``, ``type``,
``callable``, ``getattr``/``hasattr``/``setattr``/``delattr``, ``object``'s own attribute
protocol and ``object.__new__``, ``vars`` and ``inspect.signature``.

They answer from the trackers' Python types and go through the trackers' attribute protocol,
so unlike the rest of ``builtins`` they know user objects, classes and nn.Modules. Registered
into ``handlers.HANDLERS`` on import (``builder`` imports this module).
"""
from __future__ import annotations

import builtins
import inspect
import types

import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import BoundMethodVariable, ConstantVariable, NotConstant
from ember.frontend.variables.builtins import fold, unsupported
from ember.frontend.variables.functions import (BaseUserFunctionVariable, GraphCallableVariable,
                                                NestedUserFunctionVariable, PartialVariable,
                                                UserFunctionVariable, UserMethodVariable)
from ember.frontend.variables.handlers import HandlerFunctionVariable, builtin
from ember.frontend.variables.modules import NNModuleVariable
from ember.frontend.variables.tensor import TensorVariable
from ember.frontend.variables.user_defined import (UserDefinedClassVariable,
                                                   UserDefinedObjectVariable, new_plain_object)


def _python_type(vt):
    return vt.python_type()


@builtin(isinstance)
def _isinstance(tx, args, kwargs):
    obj, classinfo = args
    typ = _python_type(obj)
    try:
        classes = classinfo.as_python_constant()
    except NotConstant:
        raise Unsupported("isinstance() with a non-constant class") from None
    if isinstance(obj, TensorVariable):
        if typ is torch.nn.Parameter:
            return ConstantVariable(builtins.issubclass(torch.nn.Parameter, classes))
        return ConstantVariable(builtins.issubclass(torch.Tensor, classes) or (
            isinstance(classes, tuple) and torch.Tensor in classes))
    try:
        return ConstantVariable(builtins.issubclass(typ, classes))
    except TypeError as e:
        raise Unsupported(f"isinstance(): {e}") from None


@builtin(issubclass)
def _issubclass(tx, args, kwargs):
    return fold(tx, issubclass, args, kwargs) or unsupported("issubclass on non-constants")


@builtin(type)
def _type(tx, args, kwargs):
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments")
    return tx.wrap(_python_type(args[0]), None)


@builtin(callable)
def _callable(tx, args, kwargs):
    obj = args[0]
    if isinstance(obj, (BaseUserFunctionVariable, UserMethodVariable, GraphCallableVariable,
                        HandlerFunctionVariable, PartialVariable, BoundMethodVariable,
                        NNModuleVariable, UserDefinedClassVariable)):
        return ConstantVariable(True)
    if isinstance(obj, UserDefinedObjectVariable):
        return ConstantVariable(callable(obj.cls) and hasattr(obj.cls, "__call__"))
    return ConstantVariable(callable(obj.as_python_constant()) if obj.is_python_constant()
                            else False)


@builtin(getattr)
def _getattr(tx, args, kwargs):
    obj, name = args[0], args[1].as_python_constant()
    if len(args) == 3:
        try:
            return tx.getattr(obj, name)
        except Unsupported as e:
            if "AttributeError" in str(e) or "has no attribute" in str(e):
                return args[2]
            raise
    return tx.getattr(obj, name)


@builtin(hasattr)
def _hasattr(tx, args, kwargs):
    obj, name = args[0], args[1].as_python_constant()
    try:
        tx.getattr(obj, name)
        return ConstantVariable(True)
    except Unsupported as e:
        if "AttributeError" in str(e) or "has no attribute" in str(e):
            return ConstantVariable(False)
        raise


@builtin(setattr)
def _setattr(tx, args, kwargs):
    tx.store_attr(args[0], args[1].as_python_constant(), args[2])
    return ConstantVariable(None)


@builtin(delattr)
def _delattr(tx, args, kwargs):
    tx.del_attr(args[0], args[1].as_python_constant())
    return ConstantVariable(None)


def _plain_object(args, n: int, what: str):
    if len(args) != n or not isinstance(args[0], UserDefinedObjectVariable):
        raise Unsupported(f"object.{what} of {args[0] if args else 'nothing'}")
    return args[0], args[1].as_python_constant()


# object's own attribute protocol, called by a class's Python __getattribute__/__setattr__/
# __delattr__ (``super().__setattr__(k, v)``, ``object.__setattr__(self, k, v)``)
@builtin(object.__getattribute__)
def _object_getattribute(tx, args, kwargs):
    obj, name = _plain_object(args, 2, "__getattribute__")
    return obj.generic_getattr(tx, name)


@builtin(object.__setattr__)
def _object_setattr(tx, args, kwargs):
    obj, name = _plain_object(args, 3, "__setattr__")
    obj.generic_setattr(tx, name, args[2])
    return ConstantVariable(None)


@builtin(object.__delattr__)
def _object_delattr(tx, args, kwargs):
    obj, name = _plain_object(args, 2, "__delattr__")
    obj.generic_delattr(tx, name)
    return ConstantVariable(None)


@builtin(object.__new__)
def _object_new(tx, args, kwargs):
    if kwargs or len(args) != 1 or not isinstance(args[0], UserDefinedClassVariable):
        raise Unsupported("object.__new__ with arguments")
    return new_plain_object(tx, args[0].value)


@builtin(vars)
def _vars(tx, args, kwargs):
    if len(args) == 1 and not kwargs and isinstance(args[0], UserDefinedObjectVariable) and \
            args[0].is_new:
        return args[0].instance_dict()
    raise Unsupported("call to vars(), a builtin with effects outside the graph")


@builtin(inspect.signature)
def _signature(tx, args, kwargs):
    fn = args[0]
    drop_first = False
    if isinstance(fn, UserMethodVariable):
        fn, drop_first = fn.fn_var, True
    if isinstance(fn, UserFunctionVariable):
        sig = inspect.signature(fn.value, follow_wrapped=kwargs.get(
            "follow_wrapped", ConstantVariable(True)).as_python_constant())
    elif isinstance(fn, NestedUserFunctionVariable):
        sig = inspect.signature(types.FunctionType(fn.code, {}, fn.name))
    else:
        raise Unsupported(f"inspect.signature of {fn}")
    if drop_first:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return ConstantVariable(sig)
