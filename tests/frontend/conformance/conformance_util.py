"""Shared helper of the frontend conformance suite (``tests/frontend/conformance/``),
also used by the other folders of ``tests/frontend/``.

``check(fn, inputs_a, inputs_b)`` runs ``fn`` eagerly and through ``ember.compile(fn,
backend=CompileCounter())`` on two input sets, and asserts that outputs, input mutations,
raised exception types (and, with ``backward=True``, gradients) agree, and that exactly
``graphs`` graphs reached the backend over both sets (``ops``: total ``call_*`` nodes).
Both runs start from the same random-number state and must leave the same one (a compiled
call that skips, adds or reorders a draw changes every random number afterwards). NumPy
arrays in outputs are compared by type, dtype, shape and value.

Conventions:
- Every input set is deep-copied twice (one copy for eager, one for compiled), so in-place
  mutation of inputs is compared after the call. ``nn.Module`` objects inside the inputs are
  NOT copied: the same module object is passed to eager and compiled calls (a fresh module
  object per call would legitimately change guards), so modules passed as arguments must not
  mutate their own state (use eval() for BatchNorm/Dropout there).
- With ``module=True`` ``fn`` is an ``nn.Module``: two deep copies are made, one run eagerly,
  the other compiled (``ember.compile(copy, backend=cnt)``); their state_dicts (buffers such as
  BatchNorm running stats) are compared after every call.
- ``inputs_b=None`` derives the second set from the first: float tensors become fresh random
  tensors (non-negative if the original was), integer/bool tensors are shuffled (so indices
  stay valid), strides and ``requires_grad`` are kept, Python values are kept (a changed Python
  constant would force a recompile).
- Every program with ``graphs=1`` does at least one tensor op: a frame without ops may
  legitimately produce no graph at all (TorchDynamo skips such frames).

Environment switches (for triage):
- ``EMBER_CONFORMANCE_SKIP_COUNT=1`` skips the graph/op count assertions, so only the
  eager-vs-compiled comparison is checked.
- ``EMBER_CONFORMANCE_BACKEND=ember`` compiles the captured graphs with that backend instead
  of running them as captured: the ~350 programs then also exercise ATen tracing and the
  generated kernels.
- ``EMBER_CONFORMANCE_GRAPH_BREAKS=0`` tells the fallback tests to expect a frontend that runs
  frames it cannot capture eagerly (``graph_breaks_enabled()`` False); by default they expect
  graph breaks, with TorchDynamo's graph counts.
"""
from __future__ import annotations

import collections
import copy
import functools
import os
import types
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember.testing import CompileCounter, same


def skip_count() -> bool:
    return os.environ.get("EMBER_CONFORMANCE_SKIP_COUNT", "") not in ("", "0")


def graph_breaks_enabled() -> bool:
    return os.environ.get("EMBER_CONFORMANCE_GRAPH_BREAKS", "1") not in ("", "0")


@pytest.fixture(autouse=True)
def _seed_rng():
    """Import into each test module: reproducible random inputs per test."""
    torch.manual_seed(0)
    yield


# ----------------------------------------------------------------------------- copying inputs

def _is_plain_object(x: Any) -> bool:
    """A user-defined object whose state lives in ``__dict__`` (dataclass, plain class)."""
    return (hasattr(x, "__dict__")
            and not isinstance(x, (type, torch.nn.Module, torch.Tensor, types.FunctionType,
                                   types.MethodType, types.BuiltinFunctionType,
                                   types.ModuleType, functools.partial))
            and type(x).__module__ not in ("builtins", "torch", "functools"))


def _modules_in(x: Any, seen: dict, out: dict) -> None:
    if id(x) in seen:
        return
    seen[id(x)] = x
    if isinstance(x, torch.nn.Module):
        out[id(x)] = x
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in x:
            _modules_in(v, seen, out)
    elif isinstance(x, dict):
        for v in x.values():
            _modules_in(v, seen, out)
    elif _is_plain_object(x):
        for v in vars(x).values():
            _modules_in(v, seen, out)


def clone_inputs(inputs: tuple) -> tuple:
    """Deep copy preserving aliasing and strides; nn.Modules are shared, not copied."""
    memo: dict = {}
    mods: dict = {}
    _modules_in(inputs, {}, mods)
    memo.update(mods)
    return copy.deepcopy(inputs, memo)


def _fresh_like(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if t.is_floating_point() or t.is_complex():
            new = torch.randn(t.shape, dtype=t.dtype)
            if t.numel() and not t.is_complex() and bool((t >= 0).all()):
                new = new.abs() + 0.05
        elif t.numel() > 1:
            flat = t.detach().reshape(-1)
            new = flat[torch.randperm(flat.numel())].reshape(t.shape)
        else:
            new = t.detach().clone()
        out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(new)
    return out.requires_grad_(t.requires_grad)


def _map_tensors(x: Any, f, memo: dict) -> Any:
    if id(x) in memo:
        return memo[id(x)]
    if isinstance(x, torch.Tensor):
        out = f(x)
    elif isinstance(x, torch.nn.Module):
        out = x
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        out = type(x)(*[_map_tensors(v, f, memo) for v in x])
    elif isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        out = type(x)(_map_tensors(v, f, memo) for v in x)
    elif type(x) is dict:
        out = {k: _map_tensors(v, f, memo) for k, v in x.items()}
    elif _is_plain_object(x):
        out = copy.copy(x)
        for k, v in vars(x).items():
            object.__setattr__(out, k, _map_tensors(v, f, memo))
    else:
        out = x
    memo[id(x)] = out
    return out


def fresh_inputs(inputs: tuple) -> tuple:
    """Same structure, Python values and tensor shapes/dtypes/strides; new tensor values."""
    return _map_tensors(inputs, _fresh_like, {})


# ----------------------------------------------------------------------------- comparing

def _canon(x: Any, memo: dict | None = None) -> Any:
    """Turn user objects into comparable tuples so ``same`` can compare them."""
    if memo is None:
        memo = {}
    if isinstance(x, torch.Tensor) or isinstance(x, torch.nn.Module):
        return x
    if isinstance(x, np.ndarray):
        # compared as a tensor, tagged so an ndarray never equals a tensor
        return ("<ndarray>", str(x.dtype), torch.from_numpy(np.array(x)))
    if isinstance(x, np.generic):
        return ("<numpy scalar>", str(x.dtype), torch.from_numpy(np.asarray(x)))
    if id(x) in memo:
        return ("<cycle>",)
    memo[id(x)] = True
    try:
        if isinstance(x, tuple) and hasattr(x, "_fields") and type(x) is not torch.Size:
            return type(x)(*[_canon(v, memo) for v in x])
        if type(x) in (list, tuple):
            return type(x)(_canon(v, memo) for v in x)
        if type(x) is collections.deque:
            return ("<deque>", x.maxlen, [_canon(v, memo) for v in x])
        if type(x) is dict:
            return {k: _canon(v, memo) for k, v in x.items()}
        if _is_plain_object(x):
            return ("<object>", type(x).__qualname__, _canon(dict(vars(x)), memo))
        return x
    finally:
        del memo[id(x)]


def _short(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 400 else s[:400] + "...<truncated>"


def first_difference(a: Any, b: Any, path: str = "", rtol=1e-5, atol=1e-6) -> str | None:
    """Where two (canonicalised) values differ, for the assertion message; None if same."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if not same(a, b, rtol=rtol, atol=atol):
            what = ("dtype" if a.dtype != b.dtype else "shape" if a.shape != b.shape
                    else "device" if a.device != b.device else "values")
            return (f"at {path or '<root>'}: tensors differ in {what}: eager={_short(a)} "
                    f"compiled={_short(b)}")
        if a.requires_grad != b.requires_grad:
            return (f"at {path or '<root>'}: requires_grad differs: eager={a.requires_grad} "
                    f"compiled={b.requires_grad}")
        return None
    if type(a) is not type(b):
        return (f"at {path or '<root>'}: types differ: eager={type(a).__name__} {_short(a)} "
                f"compiled={type(b).__name__} {_short(b)}")
    if isinstance(a, (list, tuple)) and type(a) is not torch.Size:
        if len(a) != len(b):
            return f"at {path or '<root>'}: lengths differ: eager={len(a)} compiled={len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]", rtol, atol)
            if d:
                return d
        return None
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            return (f"at {path or '<root>'}: dict keys differ: eager={list(a)} "
                    f"compiled={list(b)}")
        for k in a:
            d = first_difference(a[k], b[k], f"{path}[{k!r}]", rtol, atol)
            if d:
                return d
        return None
    if isinstance(a, torch.nn.Module):
        return None
    if not same(a, b, rtol=rtol, atol=atol):
        return f"at {path or '<root>'}: eager={_short(a)} compiled={_short(b)}"
    return None


def _tensors(x: Any, out: list, seen: set) -> list:
    if id(x) in seen:
        return out
    seen.add(id(x))
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out, seen)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors(v, out, seen)
    elif _is_plain_object(x):
        for v in vars(x).values():
            _tensors(v, out, seen)
    return out


def _backward(out: Any) -> None:
    ts = [t for t in _tensors(out, [], set()) if t.requires_grad and t.is_floating_point()]
    if ts:
        sum((t * (i + 1)).sum() for i, t in enumerate(ts)).backward()


def _grads(inputs: Any, mod: torch.nn.Module | None) -> list:
    ts = [t for t in _tensors(inputs, [], set()) if t.is_leaf and t.requires_grad]
    if mod is not None:
        ts += [p for p in mod.parameters() if p.requires_grad]
    return [t.grad for t in ts]


# ----------------------------------------------------------------------------- check

def check(fn, inputs_a, inputs_b=None, *, graphs=1, ops=None, rtol=1e-5, atol=1e-6,
          module=False, backward=False, raises=None):
    """Compare ``fn`` eager vs ``ember.compile(fn, backend=CompileCounter())`` on two input sets.

    ``graphs``: expected ``cnt.frame_count`` after both sets (None: not asserted).
    ``ops``: expected ``cnt.op_count`` (None: not asserted).
    ``module``: ``fn`` is an nn.Module (two deep copies: one eager, one compiled).
    ``backward``: sum the outputs that require grad, backward, and compare the grads of the
    leaf input tensors (and of the module's parameters with ``module=True``).
    ``raises``: the exception type the program raises eagerly (on both input sets); the
    compiled program must raise the same type. Without it an eager exception fails the test.
    Returns the CompileCounter.
    """
    ember.reset()
    cnt = CompileCounter(os.environ.get("EMBER_CONFORMANCE_BACKEND") or None)
    if not isinstance(inputs_a, tuple):
        raise TypeError("inputs_a must be a tuple of positional arguments")
    if inputs_b is None:
        inputs_b = fresh_inputs(inputs_a)
    if module:
        assert isinstance(fn, torch.nn.Module), "module=True needs an nn.Module"
        eager_fn = copy.deepcopy(fn)
        compiled_target = copy.deepcopy(fn)
        compiled_fn = ember.compile(compiled_target, backend=cnt)
    else:
        eager_fn = fn
        compiled_target = None
        compiled_fn = ember.compile(fn, backend=cnt)

    for label, inputs in (("A", inputs_a), ("B", inputs_b)):
        e_in, c_in = clone_inputs(inputs), clone_inputs(inputs)
        ctx = lambda: f"[input set {label}; frame_count={cnt.frame_count}]"  # noqa: E731
        e_exc = c_exc = None
        e_out = c_out = None
        rng_before = torch.get_rng_state()
        try:
            e_out = eager_fn(*e_in)
        except Exception as exc:  # noqa: BLE001 - the program may raise on purpose
            e_exc = exc
        e_rng = torch.get_rng_state()
        torch.set_rng_state(rng_before)
        try:
            c_out = compiled_fn(*c_in)
        except Exception as exc:  # noqa: BLE001
            c_exc = exc
        c_rng = torch.get_rng_state()
        if raises is not None:
            assert type(e_exc) is raises, (
                f"{ctx()} the program should raise {raises.__name__} eagerly, got "
                f"{type(e_exc).__name__ if e_exc is not None else 'no exception'}")
        elif e_exc is not None:
            raise AssertionError(f"{ctx()} the eager program itself raised "
                                 f"{type(e_exc).__name__}: {e_exc}") from e_exc
        if e_exc is not None:
            assert c_exc is not None, (
                f"{ctx()} eager raised {type(e_exc).__name__}: {e_exc} but compiled returned "
                f"{_short(c_out)}")
            assert type(c_exc) is type(e_exc), (
                f"{ctx()} eager raised {type(e_exc).__name__}: {e_exc}; compiled raised "
                f"{type(c_exc).__name__}: {c_exc}")
            continue
        if c_exc is not None:
            raise AssertionError(f"{ctx()} eager returned {_short(e_out)} but compiled raised "
                                 f"{type(c_exc).__name__}: {c_exc}") from c_exc
        diff = first_difference(_canon(e_out), _canon(c_out), "out", rtol, atol)
        assert diff is None and same(_canon(e_out), _canon(c_out), rtol=rtol, atol=atol), (
            f"{ctx()} outputs differ {diff}")
        diff = first_difference(_canon(e_in), _canon(c_in), "inputs", rtol, atol)
        assert diff is None, f"{ctx()} input mutations differ {diff}"
        assert torch.equal(e_rng, c_rng), \
            f"{ctx()} the random-number state after the call differs from eager's"
        if module:
            diff = first_difference(dict(eager_fn.state_dict()),
                                    dict(compiled_target.state_dict()), "state_dict", rtol, atol)
            assert diff is None, f"{ctx()} module state differs after the call {diff}"
            assert eager_fn.training == compiled_target.training, f"{ctx()} training flag"
        if backward:
            _backward(e_out)
            _backward(c_out)
            e_g = _grads(e_in, eager_fn if module else None)
            c_g = _grads(c_in, compiled_target if module else None)
            assert any(g is not None for g in e_g), f"{ctx()} backward produced no grads"
            diff = first_difference(e_g, c_g, "grads", rtol, atol)
            assert diff is None, f"{ctx()} gradients differ {diff}"
            if module:
                eager_fn.zero_grad(set_to_none=True)
                compiled_target.zero_grad(set_to_none=True)

    if not skip_count():
        if graphs is not None:
            assert cnt.frame_count == graphs, (
                f"expected {graphs} graph(s) to reach the backend, got frame_count="
                f"{cnt.frame_count} (op_count={cnt.op_count}); graphs:\n"
                + "\n".join(str(g.graph) for g in cnt.graphs))
        if ops is not None:
            assert cnt.op_count == ops, (
                f"expected op_count={ops}, got {cnt.op_count} (frame_count={cnt.frame_count}); "
                "graphs:\n" + "\n".join(str(g.graph) for g in cnt.graphs))
    return cnt
