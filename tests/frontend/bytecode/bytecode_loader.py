"""Imports ember.frontend.bytecode/analysis, also on a Python without torch (the 3.12
bytecode checks run there): the ember package is stubbed by path so its __init__, which
imports torch, never runs. Neither module imports torch."""
import importlib
import pathlib
import sys
import types

_ROOT = pathlib.Path(__file__).resolve().parents[3]


def _import_frontend():
    try:
        import torch  # noqa: F401
    except ImportError:
        for name, path in (("ember", _ROOT / "ember"),
                           ("ember.frontend", _ROOT / "ember" / "frontend")):
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [str(path)]
                sys.modules[name] = package
    return (importlib.import_module("ember.frontend.bytecode"),
            importlib.import_module("ember.frontend.analysis"))
