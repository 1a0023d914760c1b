"""Counters the compiler keeps about what it did; tests and the benchmark read them.

``counters["frontend"]["graphs"]``: graphs handed to a backend; ``["frames_eager"]``: frames
that fell back to eager; ``["graph_breaks"]``: graph breaks; ``["recompiles"]``. ``reset()``
clears them (``ember.reset()`` does too).
"""
from __future__ import annotations

import collections

counters: "collections.defaultdict[str, collections.Counter]" = collections.defaultdict(
    collections.Counter)


def reset() -> None:
    counters.clear()
