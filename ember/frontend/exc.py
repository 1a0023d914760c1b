"""Errors the frontend raises while capturing a frame."""
from __future__ import annotations


class Unsupported(Exception):
    """Capture met something it cannot handle: the graph breaks there, or (when breaking is
    not safe) the frame runs eagerly.

    ``where`` is the user's ``file:line`` when known, so ``fullgraph=True`` can say where;
    ``user_stack`` the file:line of each frame from the compiled one to ``where``.
    ``break_step`` is the number of instructions the top frame had started when the error
    came (the instruction that breaks); ``inlined`` says whether it came from a function
    the top frame inlined.
    """

    # raised where symbolic sizes were involved (a meta kernel failing on SymInts): the frame
    # is captured again with static sizes (``convert.convert_frame``)
    symbolic_sizes = False

    def __init__(self, msg: str, where: str | None = None):
        self.msg = msg
        self.where = where
        self.user_stack: list[str] = []
        self.filename: str | None = None
        self.lineno: int | None = None
        self.break_step: int | None = None
        self.inlined = False
        super().__init__(msg if where is None else f"{msg} (at {where})")

    def locate(self, where: str, user_stack: list[str], filename: str, lineno: int) -> None:
        self.where = where
        self.user_stack = user_stack
        self.filename, self.lineno = filename, lineno
        self.args = (f"{self.msg} (at {where})",)


class ObservedException(Unsupported):
    """The traced program raised ``exc_type`` (a dict lookup of a missing key) at a point
    where nothing has changed yet. A function the frame inlined that catches it there runs
    its handler during capture (``copy._keep_alive``: ``try: memo[k] ... except KeyError``);
    uncaught, it is an Unsupported like any other: the graph breaks and the instruction
    raises for real. ``args`` are the exception's arguments as trackers."""

    def __init__(self, exc_type: type, args: list, msg: str):
        super().__init__(f"{exc_type.__name__}: {msg}")
        self.exc_type = exc_type
        self.exc_args = args


class GraphBreakError(Unsupported):
    """``fullgraph=True``: the frame would break its graph here (the same reason and
    location a graph break reports)."""

    @classmethod
    def from_unsupported(cls, e: Unsupported) -> "GraphBreakError":
        out = cls(e.msg, e.where)
        out.user_stack, out.filename, out.lineno = e.user_stack, e.filename, e.lineno
        return out


class InternalError(Exception):
    """A bug in Ember's frontend (not in the user's program)."""
