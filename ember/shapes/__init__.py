"""Symbolic sizes: Ember's node class for ``torch.SymInt``, and the shape environment.

    from ember.shapes import ShapeEnv
    env = ShapeEnv()
    s0, s1 = env.create_sizes([8, 5], ["L['x'].size(0)", "L['x'].size(1)"])
    with torch._dispatch.python.enable_python_dispatcher():   # view/broadcast meta kernels
        y = torch.empty(s0, s1, device="meta").reshape(s1, -1)   # y.shape: (s1, s0)
    env.guards_as_python()   # "L['x'].size(0) >= 2 and L['x'].size(1) >= 2 and ..." (the
                             # branches torch's reshape took on the sizes, as guards)

Modules: ``env.py`` (:class:`ShapeEnv`: symbols, hints, ranges, guards, their Python text
and checker), ``node.py`` (:class:`SymNode`: the protocol torch's ``SymInt``/``SymFloat``/
``SymBool`` forward to), ``functions.py`` (``FloorDiv``, ``Mod``: Python's integer
semantics in sympy), ``ranges.py`` (value ranges and what they decide), ``printer.py``
(expressions as Python text), ``geometry.py`` (an input tensor's sizes, strides and storage
offset as expressions, for ``ember.fake``'s symbolic fakes).

This package is self-contained: it builds on torch's carriers and meta kernels and on sympy,
and imports no other part of Ember, and nothing of torch's own compiler (DESIGN.md §4).
Fake tensors use it (``FakeTensorMode(shape_env=...).from_real(t, dynamic_dims=...)``);
the frontend owns one env per capture (``ember/frontend/symbolic_inputs.py``, its policy in
``ember/frontend/dynamic.py``); the backend maps a graph's symbols onto an env of its own
(``ember/backend/symbolic.py``) to trace and lower with symbolic sizes.
"""
from ember.shapes.env import Guard, GuardFailure, ShapeEnv, user_location
from ember.shapes.functions import FloorDiv, Mod, TruncToInt
from ember.shapes.node import SymNode
from ember.shapes.printer import GUARD_GLOBALS, to_python
from ember.shapes.ranges import ValueRange

__all__ = ["ShapeEnv", "Guard", "GuardFailure", "SymNode", "ValueRange", "FloorDiv", "Mod",
           "TruncToInt", "to_python", "GUARD_GLOBALS", "user_location"]
