"""A script of ``benchmarks/`` imported as a module, for its tests (this folder is on
``sys.path`` under pytest)."""
import contextlib
import importlib.util
import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def loaded(script: str):
    """``benchmarks/<script>.py`` as a module, registered in ``sys.modules`` while in use
    (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{script}",
                                                  BENCHMARKS / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
