"""Ember: a just-in-time compiler for PyTorch programs.

    model = ember.compile(model)     # or @ember.compile on a function
"""
from ember import config, logs
from ember.api import (OptimizedFunction, OptimizedModule, allow_in_graph, compile, disable,
                       explain, mark_dynamic, mark_static, maybe_mark_dynamic, reset)
from ember.frontend.dynamic import ConstraintViolation
from ember.frontend.exc import GraphBreakError
from ember.frontend.support import UnsupportedPythonError
from ember.backend_registry import list_backends, register_backend
from ember import testing

__all__ = ["compile", "reset", "disable", "allow_in_graph", "explain", "GraphBreakError",
           "mark_dynamic", "maybe_mark_dynamic", "mark_static", "ConstraintViolation",
           "UnsupportedPythonError",
           "OptimizedFunction",
           "OptimizedModule", "config", "logs", "testing", "list_backends", "register_backend"]
__version__ = "0.1.0"
