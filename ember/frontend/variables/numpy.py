"""NumPy inside compiled code: Ember's mapping of the common NumPy API onto torch ops.

An ndarray made from a tensor (``x.numpy()``, ``np.asarray(t)``) is an
:class:`NDArrayVariable` over a TensorVariable; NumPy functions, ndarray methods and
operators on it become torch ops in the graph, and where eager returns an ndarray (or a NumPy
scalar, from a reduction over every axis) the entry converts the graph's output with
``.numpy()``. NumPy's dtype rules are kept where they differ from torch's: integer inputs to
float-valued functions (``/``, ``exp``, ``mean``) and creation functions without a dtype give
float64, as NumPy does, not torch's default float32. In-place updates (``a += 1``) would
write through to the tensor the array shares memory with, and ``np.random`` draws from
NumPy's generator: both break the graph.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import (BoundMethodVariable, ConstantVariable, NotConstant,
                                           VariableTracker)
from ember.frontend.variables.builtins import INPLACE, OPERAND_OPERATORS, fold
from ember.frontend.variables.containers import BaseSequenceVariable, TupleVariable
from ember.frontend.variables.handlers import HANDLERS
from ember.frontend.variables.tensor import TensorVariable


def torch_dtype(value) -> torch.dtype:
    """The torch dtype of a NumPy dtype spec (``np.float32``, ``"int64"``, ``float``)."""
    if isinstance(value, torch.dtype):
        return value
    return torch.from_numpy(np.empty(0, dtype=np.dtype(value))).dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


class NDArrayVariable(VariableTracker):
    """An ndarray (``scalar``: a NumPy scalar) whose data is the tensor ``tensor``."""

    def __init__(self, tensor: TensorVariable, scalar: bool = False):
        super().__init__()
        self.tensor = tensor
        self.scalar = scalar

    def python_type(self):
        return numpy_dtype(self.tensor.fake.dtype).type if self.scalar else np.ndarray

    def truthy(self, tx):
        raise Unsupported("control flow on an ndarray's value (data-dependent)")

    def rebuild(self, cg):
        text = f"{cg.reconstruct(self.tensor)}.numpy()"
        return text + "[()]" if self.scalar else text

    def unpack(self, tx):
        return [NDArrayVariable(t, scalar=t.fake.dim() == 0) for t in self.tensor.unpack(tx)]

    def var_getattr(self, tx, name):
        fake = self.tensor.fake
        if name == "shape":
            return TupleVariable([ConstantVariable(s) for s in fake.shape])
        if name in ("ndim", "size", "itemsize", "nbytes"):
            value = {"ndim": fake.dim(), "size": fake.numel(), "itemsize": fake.element_size(),
                     "nbytes": fake.numel() * fake.element_size()}[name]
            return ConstantVariable(value)
        if name == "dtype":
            return ConstantVariable(numpy_dtype(fake.dtype))
        if name == "T":
            return transpose(tx, [self], {})
        if name in METHODS:
            return BoundMethodVariable(self, name)
        raise Unsupported(f"ndarray.{name} inside a compiled region")

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return ConstantVariable(len(self.tensor.fake))
        if name == "__getitem__":
            index = args[0]
            index = index.tensor if isinstance(index, NDArrayVariable) else index
            out = tx.output.call_function(operator.getitem, [self.tensor, index], {})
            return NDArrayVariable(out, scalar=out.fake.dim() == 0)
        handler = METHODS.get(name)
        if handler is None:
            raise Unsupported(f"ndarray.{name}() inside a compiled region")
        return handler(tx, [self, *args], kwargs)

    def __repr__(self):
        return f"NDArrayVariable({self.tensor!r})"


# ----------------------------------------------------------------------------- helpers

def _const(vt, default=None):
    return default if vt is None else vt.as_python_constant()


def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _call(tx, fn, args, kwargs=None) -> TensorVariable:
    return tx.output.call_function(fn, args, kwargs or {})


def as_tensor(tx, vt) -> TensorVariable:
    """The tensor behind an array-like: an ndarray, a tensor, or constants (made with
    NumPy's dtype inference)."""
    if isinstance(vt, NDArrayVariable):
        return vt.tensor
    if isinstance(vt, TensorVariable):
        return vt
    if isinstance(vt, BaseSequenceVariable) and any(
            isinstance(v, (NDArrayVariable, TensorVariable)) for v in vt.items):
        return _call(tx, torch.stack, [TupleVariable([as_tensor(tx, v) for v in vt.items])])
    try:
        value = np.asarray(vt.as_python_constant())
    except NotConstant:
        raise Unsupported(f"a NumPy array made from {vt}") from None
    return _call(tx, torch.tensor, [tx.wrap_constant(value.tolist())],
                 {"dtype": ConstantVariable(torch_dtype(value.dtype))})


def _array(tensor: TensorVariable, *inputs) -> NDArrayVariable:
    """A result: NumPy's ufuncs and operators give a NumPy scalar for 0-d results."""
    return NDArrayVariable(tensor, scalar=tensor.fake.dim() == 0)


def _dot(tx, args, kwargs):
    """np.dot is matmul up to 2-D; beyond, it sums over other axes than matmul does."""
    if any(as_tensor(tx, a).fake.dim() > 2 for a in args[:2] if _is_array(a)):
        raise Unsupported("np.dot of arrays over 2-D")
    return elementwise(torch.matmul)(tx, args, kwargs)


def _is_array(vt) -> bool:
    return isinstance(vt, (NDArrayVariable, TensorVariable))


def _operands(tx, values, float_result: bool) -> list:
    """Tensors (and Python numbers) for a NumPy operation. Where NumPy gives float64 and
    torch its default float32 (integer arrays in a float-valued op, or with a Python float),
    integer arrays are made float64 first."""
    tensors = [as_tensor(tx, v) if _is_array(v) or not v.is_python_constant() or isinstance(
        v.as_python_constant(), (list, tuple, np.generic)) else v for v in values]
    arrays = [t for t in tensors if isinstance(t, TensorVariable)]
    has_float_number = any(not isinstance(t, TensorVariable) and isinstance(
        t.as_python_constant(), float) for t in tensors)
    if (float_result or has_float_number) and arrays and not any(
            t.fake.is_floating_point() or t.fake.is_complex() for t in arrays):
        tensors = [_call(tx, torch.Tensor.to, [t, ConstantVariable(torch.float64)])
                   if isinstance(t, TensorVariable) else t for t in tensors]
    return tensors


def elementwise(torch_fn, float_result: bool = False):
    def handler(tx, args, kwargs):
        if kwargs.get("out") is not None or kwargs.get("where") is not None:
            raise Unsupported(f"NumPy {torch_fn.__name__} with out= or where=")
        operands = _operands(tx, args, float_result)
        out = _call(tx, torch_fn, operands)
        dtype = kwargs.get("dtype")
        if dtype is not None:
            out = _call(tx, torch.Tensor.to, [out, ConstantVariable(torch_dtype(_const(dtype)))])
        return _array(out, *args)
    return handler


def apply_operator(tx, op, args) -> VariableTracker:
    """``op(*args)`` where an operand is an ndarray."""
    if any(isinstance(a, TensorVariable) for a in args):
        raise Unsupported(f"operator {op.__name__} between a tensor and an ndarray")
    if op in INPLACE:
        raise Unsupported("an in-place NumPy operation (it writes through to the tensor the "
                          "array shares memory with)")
    return elementwise(op, float_result=op is operator.truediv)(tx, args, {})


def _reduction(torch_fn, float_result=False, ddof=False, single_axis=False):
    def handler(tx, args, kwargs):
        a = args[0]
        t = _operands(tx, [a], float_result)[0]
        axis = _const(_arg(args, kwargs, 1, "axis"))
        keepdims = _const(kwargs.get("keepdims"), False)
        extra = {"correction": ConstantVariable(_const(kwargs.get("ddof"), 0))} if ddof else {}
        if kwargs.get("dtype") is not None:
            t = _call(tx, torch.Tensor.to, [t, ConstantVariable(torch_dtype(
                _const(kwargs["dtype"])))])
        if axis is None:
            if single_axis:   # argmax, cumsum: over the flattened array
                t = _call(tx, torch.reshape, [t, ConstantVariable((-1,))])
                out = _call(tx, torch_fn, [t, ConstantVariable(0)], extra)
                return NDArrayVariable(out, scalar=out.fake.dim() == 0)
            out = _call(tx, torch_fn, [t], extra)
            if keepdims:
                out = _call(tx, torch.reshape, [out, ConstantVariable(
                    (1,) * t.fake.dim())])
            return NDArrayVariable(out, scalar=not keepdims)
        if single_axis and not isinstance(axis, int):
            raise Unsupported(f"NumPy {torch_fn.__name__} over several axes")
        kw = {"dim": ConstantVariable(axis), **extra}
        if torch_fn not in (torch.cumsum, torch.cumprod):
            kw["keepdim"] = ConstantVariable(keepdims)
        return NDArrayVariable(_call(tx, torch_fn, [t], kw))
    return handler


def transpose(tx, args, kwargs):
    t = as_tensor(tx, args[0])
    axes = args[1:] if len(args) > 2 else [_arg(args, kwargs, 1, "axes")]
    axes = [_const(a) for a in axes if a is not None]
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = list(axes[0])
    order = tuple(axes) if axes and axes != [None] else tuple(reversed(range(t.fake.dim())))
    return NDArrayVariable(_call(tx, torch.permute, [t, ConstantVariable(order)]))


def reshape(tx, args, kwargs):
    t = as_tensor(tx, args[0])
    shape = [_const(a) for a in args[1:]] or [_const(_arg(args, kwargs, 1, "newshape") or
                                                      kwargs.get("shape"))]
    if len(shape) == 1:
        shape = shape[0]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return NDArrayVariable(_call(tx, torch.reshape, [t, ConstantVariable(shape)]))


def _ravel(tx, args, kwargs):
    return NDArrayVariable(_call(tx, torch.reshape, [as_tensor(tx, args[0]),
                                                     ConstantVariable((-1,))]))


def _astype(tx, args, kwargs):
    dtype = torch_dtype(_const(_arg(args, kwargs, 1, "dtype")))
    return _array(_call(tx, torch.Tensor.to, [as_tensor(tx, args[0]), ConstantVariable(dtype)]),
                  args[0])


def _copy(tx, args, kwargs):
    return _array(_call(tx, torch.clone, [as_tensor(tx, args[0])]), args[0])


def _squeeze(tx, args, kwargs):
    axis = _const(_arg(args, kwargs, 1, "axis"))
    extra = [ConstantVariable(axis)] if axis is not None else []
    return NDArrayVariable(_call(tx, torch.squeeze, [as_tensor(tx, args[0]), *extra]))


def _expand_dims(tx, args, kwargs):
    return NDArrayVariable(_call(tx, torch.unsqueeze, [as_tensor(tx, args[0]),
                                                       _arg(args, kwargs, 1, "axis")]))


def _join(torch_fn):
    def handler(tx, args, kwargs):
        tensors = [as_tensor(tx, v) for v in tx.unpack_iterable(args[0])]
        axis = _const(_arg(args, kwargs, 1, "axis"), 0)
        if axis is None:
            tensors = [_call(tx, torch.reshape, [t, ConstantVariable((-1,))]) for t in tensors]
            axis = 0
        return NDArrayVariable(_call(tx, torch_fn, [TupleVariable(tensors),
                                                    ConstantVariable(axis)]))
    return handler


def _clip(tx, args, kwargs):
    lo, hi = _arg(args, kwargs, 1, "a_min"), _arg(args, kwargs, 2, "a_max")
    t = as_tensor(tx, args[0])
    bounds = [as_tensor(tx, b) if _is_array(b) else b for b in (lo, hi)]
    out = _call(tx, torch.clamp, [t, *bounds])
    return _array(out, args[0])


def _where(tx, args, kwargs):
    if len(args) != 3:
        raise Unsupported("np.where with one argument (data-dependent size)")
    cond = as_tensor(tx, args[0])
    a, b = _operands(tx, args[1:], False)
    return NDArrayVariable(_call(tx, torch.where, [cond, a, b]))


def _broadcast_to(tx, args, kwargs):
    return NDArrayVariable(_call(tx, torch.Tensor.expand, [
        as_tensor(tx, args[0]), ConstantVariable(tuple(_const(_arg(args, kwargs, 1, "shape"))))]))


def _flip(tx, args, kwargs):
    t = as_tensor(tx, args[0])
    axis = _const(_arg(args, kwargs, 1, "axis"))
    dims = tuple(range(t.fake.dim())) if axis is None else (
        (axis,) if isinstance(axis, int) else tuple(axis))
    return NDArrayVariable(_call(tx, torch.flip, [t, ConstantVariable(dims)]))


def _creation(torch_fn, takes_fill=False):
    """zeros/ones/full/empty: NumPy's default dtype is float64 (full: the fill's)."""
    def handler(tx, args, kwargs):
        shape = _const(_arg(args, kwargs, 0, "shape"))
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        rest = []
        dtype = _const(_arg(args, kwargs, 2 if takes_fill else 1, "dtype"))
        if takes_fill:
            fill = _arg(args, kwargs, 1, "fill_value")
            rest = [fill]
            if dtype is None:
                dtype = np.asarray(_const(fill)).dtype
        out = _call(tx, torch_fn, [ConstantVariable(shape), *rest],
                    {"dtype": ConstantVariable(torch_dtype(float if dtype is None else dtype))})
        return NDArrayVariable(out)
    return handler


def _like(torch_fn, takes_fill=False):
    def handler(tx, args, kwargs):
        t = as_tensor(tx, args[0])
        dtype = _const(kwargs.get("dtype"))
        kw = {"dtype": ConstantVariable(torch_dtype(dtype))} if dtype is not None else {}
        return NDArrayVariable(_call(tx, torch_fn, [t, *args[1:2]] if takes_fill else [t], kw))
    return handler


def _from_constants(numpy_fn):
    """arange, linspace, eye: NumPy computes the values' dtype from constant arguments."""
    def handler(tx, args, kwargs):
        try:
            consts = [a.as_python_constant() for a in args]
            kw = {k: v.as_python_constant() for k, v in kwargs.items()}
        except NotConstant:
            raise Unsupported(f"np.{numpy_fn.__name__} of non-constant arguments") from None
        value = numpy_fn(*consts, **kw)    # its dtype and shape are NumPy's answer
        dtype = ConstantVariable(torch_dtype(value.dtype))
        if numpy_fn is np.arange:
            out = _call(tx, torch.arange, [ConstantVariable(c) for c in consts], {"dtype": dtype})
        elif numpy_fn is np.linspace:
            num = kw.get("num", consts[2] if len(consts) > 2 else 50)
            out = _call(tx, torch.linspace, [ConstantVariable(consts[0]),
                                             ConstantVariable(consts[1]),
                                             ConstantVariable(num)], {"dtype": dtype})
        else:
            out = _call(tx, torch.eye, [ConstantVariable(n) for n in value.shape],
                        {"dtype": dtype})
        return NDArrayVariable(out)
    return handler


def _asarray(copy: bool):
    def handler(tx, args, kwargs):
        t = as_tensor(tx, args[0])
        dtype = _const(_arg(args, kwargs, 1, "dtype"))
        if dtype is not None:
            t = _call(tx, torch.Tensor.to, [t, ConstantVariable(torch_dtype(dtype))])
        elif copy and _is_array(args[0]):
            t = _call(tx, torch.clone, [t])
        return NDArrayVariable(t)
    return handler


def _from_numpy(tx, args, kwargs):
    if not isinstance(args[0], NDArrayVariable):
        raise Unsupported(f"torch.from_numpy of {args[0]}")
    return args[0].tensor


def tensor_to_ndarray(tx, tensor: TensorVariable, args, kwargs) -> NDArrayVariable:
    """``t.numpy()``: eager refuses tensors that require grad."""
    if tensor.fake.requires_grad:
        raise Unsupported("Tensor.numpy() of a tensor that requires grad (eager raises)")
    return NDArrayVariable(tensor)


def _not_constant(cls):
    raise Unsupported(f"np.{cls.__name__}() of non-constant arguments")


def _refused(tx, args, kwargs):
    raise Unsupported("ndarray.item()/tolist() reads the array's data (data-dependent)")


# ----------------------------------------------------------------------------- tables

_FLOAT_UFUNCS = {np.exp: torch.exp, np.log: torch.log, np.sin: torch.sin, np.cos: torch.cos,
                 np.tan: torch.tan, np.tanh: torch.tanh, np.sinh: torch.sinh,
                 np.cosh: torch.cosh, np.sqrt: torch.sqrt, np.log2: torch.log2,
                 np.log10: torch.log10, np.log1p: torch.log1p, np.expm1: torch.expm1,
                 np.exp2: torch.exp2, np.arcsin: torch.asin, np.arccos: torch.acos,
                 np.arctan: torch.atan, np.floor: torch.floor, np.ceil: torch.ceil,
                 np.trunc: torch.trunc, np.divide: torch.true_divide,
                 np.arctan2: torch.atan2, np.hypot: torch.hypot}
_UFUNCS = {np.abs: torch.abs, np.absolute: torch.abs, np.negative: torch.neg,
           np.square: torch.square, np.sign: torch.sign, np.add: torch.add,
           np.subtract: torch.sub, np.multiply: torch.mul, np.power: torch.pow,
           np.maximum: torch.maximum, np.minimum: torch.minimum, np.matmul: torch.matmul,
           np.floor_divide: torch.floor_divide,
           np.remainder: torch.remainder, np.equal: torch.eq, np.not_equal: torch.ne,
           np.less: torch.lt, np.less_equal: torch.le, np.greater: torch.gt,
           np.greater_equal: torch.ge, np.logical_and: torch.logical_and,
           np.logical_or: torch.logical_or, np.logical_not: torch.logical_not,
           np.isnan: torch.isnan, np.isfinite: torch.isfinite}
_REDUCTIONS = {
    "sum": _reduction(torch.sum), "mean": _reduction(torch.mean, float_result=True),
    "max": _reduction(torch.amax), "min": _reduction(torch.amin),
    "prod": _reduction(torch.prod, single_axis=True),
    "std": _reduction(torch.std, float_result=True, ddof=True),
    "var": _reduction(torch.var, float_result=True, ddof=True),
    "argmax": _reduction(torch.argmax, single_axis=True),
    "argmin": _reduction(torch.argmin, single_axis=True),
    "all": _reduction(torch.all), "any": _reduction(torch.any),
    "cumsum": _reduction(torch.cumsum, single_axis=True),
    "cumprod": _reduction(torch.cumprod, single_axis=True),
}
_SHAPES = {"reshape": reshape, "transpose": transpose, "ravel": _ravel, "flatten": _ravel,
           "squeeze": _squeeze, "clip": _clip, "copy": _copy}

# ndarray methods: the NumPy function of the same name, the array first
METHODS = {**_REDUCTIONS, **_SHAPES, "astype": _astype, "dot": _dot,
           "round": elementwise(torch.round), "item": _refused, "tolist": _refused}

FUNCTIONS = {
    **{f: elementwise(t, float_result=True) for f, t in _FLOAT_UFUNCS.items()},
    **{f: elementwise(t) for f, t in _UFUNCS.items()},
    **{getattr(np, name): h for name, h in {**_REDUCTIONS, **_SHAPES}.items()
       if hasattr(np, name)},
    np.amax: _REDUCTIONS["max"], np.amin: _REDUCTIONS["min"], np.true_divide:
        elementwise(torch.true_divide, float_result=True),
    np.round: elementwise(torch.round), np.swapaxes: lambda tx, args, kwargs: NDArrayVariable(
        _call(tx, torch.transpose, [as_tensor(tx, args[0]), *args[1:3]])),
    np.dot: _dot, np.expand_dims: _expand_dims, np.concatenate: _join(torch.cat), np.stack: _join(torch.stack),
    np.where: _where, np.broadcast_to: _broadcast_to, np.flip: _flip,
    np.zeros: _creation(torch.zeros), np.ones: _creation(torch.ones),
    np.full: _creation(torch.full, takes_fill=True), np.zeros_like: _like(torch.zeros_like),
    np.ones_like: _like(torch.ones_like), np.full_like: _like(torch.full_like, True),
    np.arange: _from_constants(np.arange), np.linspace: _from_constants(np.linspace),
    np.eye: _from_constants(np.eye), np.asarray: _asarray(copy=False),
    np.array: _asarray(copy=True), torch.from_numpy: _from_numpy,
}
# dtypes and type information are Python constants at capture
for _cls in (np.dtype, np.finfo, np.iinfo, np.float16, np.float32, np.float64, np.int8,
             np.int16, np.int32, np.int64, np.uint8, np.bool_, np.complex64, np.complex128):
    FUNCTIONS[_cls] = (lambda c: lambda tx, args, kwargs: fold(tx, c, args, kwargs) or
                       _not_constant(c))(_cls)

HANDLERS.update(FUNCTIONS)
OPERAND_OPERATORS[NDArrayVariable] = apply_operator
