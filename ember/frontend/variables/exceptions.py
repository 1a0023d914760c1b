"""Exceptions raised and caught inside the traced program."""
from __future__ import annotations

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.containers import TupleVariable


class ExceptionVariable(VariableTracker):
    """An exception the traced program raised and an inlined handler caught
    (:class:`~ember.frontend.exc.ObservedException`)."""

    def __init__(self, exc_type: type, args: list[VariableTracker]):
        super().__init__()
        self.exc_type = exc_type
        self.args = args

    def python_type(self):
        return self.exc_type

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "__class__":
            return tx.wrap(self.exc_type, None)
        raise Unsupported(f"attribute {name!r} of a {self.exc_type.__name__}")

    def rebuild(self, cg):
        return cg.temp(self, f"{cg.const(self.exc_type)}({cg.items(self.args)})")

    def __repr__(self):
        return f"ExceptionVariable({self.exc_type.__name__})"
