"""One callable per concrete size of a program compiled for symbolic sizes, for what must be
decided per size: a captured CUDA graph (``cudagraphs.py``), a choice of compiled or eager
(``eager_choice.py``).

The call's int arguments (the size symbols' values, at the same positions on every call) key
the callables: with them the program's guards fix every input's shape and strides. The
``limit`` most recently used are kept; an older size gets a new one when it returns.
"""
from __future__ import annotations

import collections
from typing import Callable

from ember import logs


class PerSize:
    """``per_size(*args)``: ``make(args)``'s callable for the call's sizes, made on their
    first call; ``what`` names it in the log line of a size dropped."""

    def __init__(self, make: Callable[[tuple], Callable], limit: int, what: str):
        self.make = make
        self.limit = limit
        self.what = what
        self.size_positions: list[int] | None = None
        self.runners: collections.OrderedDict[tuple, Callable] = collections.OrderedDict()

    def __call__(self, *args):
        if self.size_positions is None:    # the int arguments: the same places every call
            self.size_positions = [i for i, a in enumerate(args) if type(a) is int]
        key = tuple(args[i] for i in self.size_positions)
        runner = self.runners.get(key)
        if runner is None:
            runner = self.runners[key] = self.make(args)
            if len(self.runners) > self.limit:
                old, _ = self.runners.popitem(last=False)
                logs.log("perf_hints", "%s: sizes %s dropped (%d sizes kept)", self.what, old,
                         self.limit)
        else:
            self.runners.move_to_end(key)
        return runner(*args)
