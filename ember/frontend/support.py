"""Which Python versions the frontend runs on, and what ``ember.compile`` does on the others.

The frontend reads and writes CPython bytecode, whose opcodes, operand encodings, exception and
line tables change with every minor version; code generated for the wrong layout can kill the
interpreter (a SIGSEGV, not an exception). So the frontend runs only on the versions
``frontend/bytecode.py`` has a table for (``SUPPORTED_PYTHONS``; bytecode.py checks at import
that its tables are exactly these), and pip's ``requires-python`` says the same.

Decision, on any other version (an install with ``--ignore-requires-python``, a future Python):
``ember.compile`` warns once per process and returns the usual wrapper, which runs the function
or module eagerly: nothing is captured, no bytecode is generated and nothing Ember generates
runs, so the program behaves as without Ember. ``fullgraph=True`` promises a graph (or an
error), so it raises :class:`UnsupportedPythonError` at ``ember.compile`` instead, and so does
``ember.explain``, whose report would otherwise claim zero graphs. Ember used as a backend of
torch's own compile entry point is not affected: torch's frontend captures there, and Ember's
backend generates kernels, not bytecode.

This module imports nothing of Ember: the check must work on a Python whose bytecode layer
would not even import.
"""
from __future__ import annotations

import sys
import warnings

# Keep in step with bytecode.py's _SPECS (one table per version), requires-python in
# pyproject.toml and the README.
SUPPORTED_PYTHONS: tuple[tuple[int, int], ...] = ((3, 11), (3, 12), (3, 13))

# The version the checks below look at; tests replace it to take the unsupported path.
RUNNING_PYTHON: tuple[int, int] = tuple(sys.version_info[:2])

_warned = False


class UnsupportedPythonError(RuntimeError):
    """The frontend cannot capture on this Python, and the caller asked for a graph."""


def _text(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


def frontend_supported() -> bool:
    return RUNNING_PYTHON in SUPPORTED_PYTHONS


def unsupported_reason() -> str:
    supported = ", ".join(_text(v) for v in SUPPORTED_PYTHONS)
    return (f"Ember's frontend does not support Python {_text(RUNNING_PYTHON)} (supported: "
            f"{supported})")


def warn_once(stacklevel: int) -> None:
    """Warn (once per process) that compiled functions run eagerly on this Python."""
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(f"{unsupported_reason()}; functions and modules passed to ember.compile "
                  f"run eagerly, uncompiled", RuntimeWarning, stacklevel=stacklevel + 1)


def refuse(what: str, hint: str) -> UnsupportedPythonError:
    """The error for ``what``, which needs a graph; ``hint``: what the user can do instead."""
    return UnsupportedPythonError(f"{unsupported_reason()}, so {what} cannot capture a graph; "
                                  f"{hint}")
