"""Errors the frontend raises while capturing a frame."""
from __future__ import annotations


class Unsupported(Exception):
    """Capture met something it cannot handle; the frame runs eagerly (or, later, breaks).

    ``where`` is the user's ``file:line`` when known, so ``fullgraph=True`` can say where.
    """

    def __init__(self, msg: str, where: str | None = None):
        self.msg = msg
        self.where = where
        self.user_stack: list[str] = []
        super().__init__(msg if where is None else f"{msg} (at {where})")


class InternalError(Exception):
    """A bug in Ember's frontend (not in the user's program)."""
