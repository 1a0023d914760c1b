"""Helpers shared by users and tests: counting backends and eager-vs-compiled comparisons."""
from __future__ import annotations

from typing import Any, Callable

import torch


class CompileCounter:
    """A backend that counts the graphs it receives and their ops, then runs them as they are
    (or hands them to ``backend``, a backend name or callable, e.g. ``"ember"``).

    ``frame_count`` is the number of graphs compiled, ``op_count`` the total number of
    ``call_*`` nodes over all of them; ``graphs`` keeps each GraphModule for inspection.
    """

    def __init__(self, backend: str | Callable | None = None):
        self.frame_count = 0
        self.op_count = 0
        self.graphs: list[torch.fx.GraphModule] = []
        self.backend = backend

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op.startswith("call_"))
        self.graphs.append(gm)
        if self.backend is None:
            return gm.forward
        from ember.backend_registry import lookup_backend
        return lookup_backend(self.backend)(gm, example_inputs)

    def clear(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs.clear()


def same(a: Any, b: Any, *, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """Structural equality of nested outputs: tensors by value, dtype and shape; rest by ==."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        return bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)) \
            if a.is_floating_point() or a.is_complex() else bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(
            same(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(
            same(a[k], b[k], rtol=rtol, atol=atol) for k in a)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return type(a) is type(b) and a == b


def run_and_get_code(fn, *args, **kwargs):
    """Compile ``fn`` with the ember backend, run it, and return ``(result, sources)``:
    the generated wrapper module and kernel sources of every graph compiled on the way."""
    from ember import api
    from ember.backend import compile as backend_compile
    backend_compile.generated_sources.clear()
    result = api.compile(fn, backend="ember")(*args, **kwargs)
    return result, list(backend_compile.generated_sources)


def check_generated(fn, *inputs, rtol: float = 1e-5, atol: float = 1e-5) -> str:
    """Compile ``fn`` with the ember backend (after ``ember.reset()``), assert its result on
    ``inputs`` equals eager's, and return the generated sources joined (for assertions on
    the code)."""
    from ember import api
    api.reset()
    result, sources = run_and_get_code(fn, *inputs)
    expected = fn(*inputs)
    assert same(expected, result, rtol=rtol, atol=atol), (expected, result)
    return "\n".join(sources)
