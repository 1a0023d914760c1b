"""The ``ops`` handler: loop bodies are Python functions that call ``ops.<name>(...)``.

``ops`` forwards every call to the handler installed with ``use_handler(h)``; running the same
body under different handlers computes different things: the dependency extractor records
loads, the counter measures cost, the C++ kernel handler emits code. Handlers implement the
methods they need; the set of operation names is the one in ``OP_NAMES`` below (a body may
only use those), so a new backend knows what to implement:

- ``load(name, index)``: the element of buffer ``name`` at the sympy ``index``;
- ``constant(value, dtype)``, ``index_expr(expr, dtype)`` (an index as a value),
  ``to_dtype(x, dtype)``, ``where(cond, a, b)``, the math of ``UNARY``/``BINARY``;
- ``masked(mask, body, other)``: ``body()`` where ``mask`` holds, ``other`` elsewhere; the
  loads ``body`` makes touch no memory where ``mask`` is false (padding, the parts of a
  ``cat``), so they may index outside their buffer there;
- ``indirect_indexing(value, size, wrap_negative=False, check=None)``: a sympy symbol
  standing for an index read from memory, for use in later ``load`` indices; the target
  checks its range, and one out of range makes the call raise ``check`` (an
  ``IndexCheck``: the exception eager's op raises; by default IndexError);
- ``rand(seed, offset)`` / ``randn(seed, offset)``: float32 uniform in [0, 1) / standard
  normal, a pure function of two int64 values (counter-based Philox; lowering/random.py).

Bodies compute values only. Storing and reducing are the kernel's: a ``Reduction`` node
says which value is reduced over which loops, and each target combines it in the way its
tiling needs (OpenMP lanes, Triton tiles), so there is no ``ops.reduction`` or
``ops.store`` for bodies to call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

# pointwise math a body may call, each (x) or (x, y); results have the operands' dtype.
# Lists: ``targets.register_op`` adds to them (an op from outside Ember's source), in place,
# so every module that imported them sees it.
UNARY = ["neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
         "atanh", "erf", "erfc", "gelu", "gelu_grad", "sigmoid", "relu", "reciprocal", "floor",
         "ceil", "round", "trunc", "sign", "logical_not", "bitwise_not", "isnan", "isinf",
         "square", "frac"]
BINARY = ["add", "sub", "mul", "truediv", "floordiv", "truncdiv", "remainder", "fmod", "pow",
          "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
          "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
          "bitwise_left_shift", "bitwise_right_shift", "copysign", "hypot", "nextafter"]
OTHER = ("load", "constant", "index_expr", "to_dtype", "where", "masked", "indirect_indexing",
         "rand", "randn")
OP_NAMES = [*UNARY, *BINARY, *OTHER]
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
               "logical_not", "isnan", "isinf"}



@dataclasses.dataclass(frozen=True)
class IndexCheck:
    """What eager raises for an index out of range of one op (they differ: gather,
    scatter and index_add raise RuntimeError, embedding, index_select and ``x[idx]``
    IndexError). A kernel that fuses several ops keeps one error flag per distinct check,
    and the wrapper raises the first flagged one's exception after the call."""
    error: str          # "IndexError" or "RuntimeError"
    message: str

    def raise_line(self) -> str:
        """The wrapper's statement raising it."""
        return f"raise {self.error}({self.message!r})"


DEFAULT_INDEX_CHECK = IndexCheck("IndexError", "index out of range")

_state = threading.local()


class _Ops:
    """``ops.add`` is a function that calls the handler installed when it is *called*, so
    lowerings can hold ``ops.add`` before any handler exists."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            handler = getattr(_state, "handler", None)
            if handler is None:
                raise RuntimeError("ops.%s called with no handler installed" % name)
            return getattr(handler, name)(*args, **kwargs)
        call.__name__ = name
        return call


ops = _Ops()


@contextlib.contextmanager
def use_handler(handler):
    prior = getattr(_state, "handler", None)
    _state.handler = handler
    try:
        yield handler
    finally:
        _state.handler = prior
