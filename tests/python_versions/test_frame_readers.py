"""Builtins that read the calling frame (``locals()``, ``globals()``, ``eval``/``exec``
without namespaces, ``vars()``/``dir()`` without arguments, ``sys._getframe``,
``inspect.currentframe``) cannot run at a graph break: the generated entry that runs the
instruction has its own frame, whose locals and globals are not the user's. The frame runs
eagerly instead, so they see what they see in eager, with the semantics of the running
Python (PEP 667 on 3.13: ``locals()`` is a fresh snapshot)."""
import inspect
import sys

import pytest
import torch

import ember
from ember.testing import same

GLOBAL_SCALE = 3


def reads_locals(x):
    y = x + 1
    names = sorted(locals())
    return y * len(names), names


def reads_globals(x):
    y = x * 2
    return y + globals()["GLOBAL_SCALE"]


def evaluates(x):
    y = x * 2
    return eval("y + x")


def lists_names(x):
    y = x - 1
    return y, dir()


def reads_frame(x):
    y = x + 2
    return y, sys._getframe().f_code.co_name, inspect.currentframe().f_code.co_name


@pytest.mark.parametrize("fn", [reads_locals, reads_globals, evaluates, lists_names,
                                reads_frame], ids=lambda f: f.__name__)
def test_frame_reading_builtins_see_the_users_frame(fn):
    ember.reset()
    x = torch.randn(3)
    compiled = ember.compile(fn, backend="eager")
    for _ in range(2):
        assert same(compiled(x), fn(x))
    ember.reset()
    explained = ember.explain(fn)(x)
    assert explained.break_reasons and all(r.frame_ran_eagerly
                                           for r in explained.break_reasons)
