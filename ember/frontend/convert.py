"""One frame -> one cache entry. (Capture lands in the following commits.)"""
from __future__ import annotations

from ember.frontend.exc import Unsupported


def convert_frame(fn, args, kwargs, settings, miss):
    raise Unsupported("bytecode capture is not implemented yet")
