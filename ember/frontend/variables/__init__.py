"""The VariableTracker family: what the symbolic evaluator holds on its stack and in locals.

Each tracker stands for one Python value during capture. Trackers with a ``source`` came from
the frame's inputs (and carry the guards that were installed when they were wrapped); the
rest were made during capture (tensors produced by graph nodes, containers built by the code).
"""
from ember.frontend.variables.base import (ConstantVariable, NotConstant, VariableTracker,
                                           is_constant_value)

__all__ = ["VariableTracker", "ConstantVariable", "NotConstant", "is_constant_value"]
