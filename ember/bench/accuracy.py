"""Is a compiled result right? Each variant's outputs (and, in training, gradients) against an
eager reference computed in higher precision.

Decisions:

- The reference is the same model and inputs, cast up to float64 (to float32 when the run is
  in float16 or bfloat16: half-precision models have ops, such as flash attention, that have
  no float64 kernel), run eagerly. The cast happens after the run dtype's cast, so the
  reference sees exactly the rounded weights the timed variants see.
- Comparing against eager alone would call a compiler wrong for reordering a sum that eager
  also gets wrong in float32; comparing against float64 alone would fail deep half-precision
  models whose eager result is itself far off. So, as TorchDynamo's benchmark runner does, a
  variant is correct when, for every output tensor, its error against the reference is at most
  ``MULTIPLIER`` times eager's own error plus a floor for the dtype (``TOLERANCE``).
- The error of a tensor is relative and root-mean-square: ``rms(actual - reference) /
  rms(reference)`` (the denominator at least 1e-6). Positions where both hold the same
  non-finite value (inf, or NaN in both) count as equal. Integer and bool outputs must be
  equal, and every output must have eager's shape; a structural difference is an error of inf.
- Mixed precision training (``--amp --mode train``): each parameter's gradient is also held
  to at most ``GRAD_MULTIPLIER`` (3) times eager's own error against the float32 reference,
  plus ``GRAD_FLOOR`` (1e-4, float32 rounding) alone, not the bfloat16 floor: eager's AMP
  gradients are about 1e-2 off, and a compiler that loses autocast's float32 ops (a layer
  norm computed from bfloat16, its backward in bfloat16) is 0.1 off on every gradient of a
  transformer while still inside ``2 * 1e-2 + 3e-2``; a lone float32 ``LayerNorm``, which
  eager computes exactly, was 1.2e-2 off.
- Every output must also have eager's strides (over dims longer than 1, whose strides
  indexing reads): ``x.view(...)`` of a result, or its data handed to other code, depends on
  them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

TOLERANCE = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2,
             torch.bfloat16: 3e-2}
MULTIPLIER = 2.0
GRAD_MULTIPLIER, GRAD_FLOOR = 3.0, 1e-4


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64, or float32 for half-precision runs."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else torch.float64


def tensors(value: Any) -> list[torch.Tensor | None]:
    """Every tensor in a nested output (tuples, lists, dicts, HF ModelOutputs), in order; a
    None inside a list or tuple stays (gradients of unused parameters are None)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):   # also transformers' ModelOutput (an OrderedDict)
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in (tensors(v) if v is not None else [None])]
    return []


def relative_error(actual: torch.Tensor | None, reference: torch.Tensor | None) -> float:
    """rms(actual - reference) / rms(reference); 0 or inf for exact (non-float) values."""
    if actual is None or reference is None:
        return 0.0 if actual is None and reference is None else math.inf
    if actual.shape != reference.shape:
        return math.inf
    if not (actual.is_floating_point() or actual.is_complex()):
        return 0.0 if torch.equal(actual.cpu(), reference.to(actual.dtype).cpu()) else math.inf
    if actual.numel() == 0:
        return 0.0
    a, r = actual.detach().double(), reference.detach().double()
    same = (a == r) | (a.isnan() & r.isnan())
    diff = torch.where(same, torch.zeros_like(a), a - r)
    r = torch.where(r.isfinite(), r, torch.zeros_like(r))
    error = diff.square().mean().sqrt().item()
    scale = max(r.square().mean().sqrt().item(), 1e-6)
    return math.inf if math.isnan(error) else error / scale


def relative_errors(actual: Any, reference: Any) -> list[float]:
    """``relative_error`` of each tensor of two nested outputs; [inf] if their structures
    differ."""
    got, want = tensors(actual), tensors(reference)
    if len(got) != len(want):
        return [math.inf]
    return [relative_error(a, r) for a, r in zip(got, want)]


@dataclasses.dataclass
class Verdict:
    correct: bool
    rel_err: float        # the largest relative error over the output tensors
    strides: str | None = None   # the first output whose strides differ from eager's, said


def stride_difference(actual: Any, eager: Any) -> str | None:
    """The first tensor of ``actual`` whose strides (over dims longer than 1) differ from
    ``eager``'s, in words, or None."""
    for i, (a, e) in enumerate(zip(tensors(actual), tensors(eager))):
        if a is None or e is None or a.shape != e.shape:
            continue
        if any(x != y for n, x, y in zip(a.shape, a.stride(), e.stride()) if n > 1):
            return f"output {i} has strides {a.stride()}, eager's {e.stride()}"
    return None


def check(actual: Any, eager: Any, reference: Any, dtype: torch.dtype) -> Verdict:
    """Is ``actual`` (a compiled variant's output) as close to ``reference`` as ``eager`` is,
    within ``MULTIPLIER`` and ``dtype``'s ``TOLERANCE``?"""
    errors = relative_errors(actual, reference)
    eager_errors = relative_errors(eager, reference)
    if len(eager_errors) != len(errors):
        return Verdict(False, math.inf)
    floor = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    correct = all(err <= MULTIPLIER * base + floor for err, base in zip(errors, eager_errors))
    strides = stride_difference(actual, eager)
    return Verdict(correct and strides is None, max(errors, default=0.0), strides)


def gradient_outliers(actual: list, eager: list, reference: list,
                      names: list[str]) -> list[tuple[str, float, float]]:
    """(name, error, eager's error) of each gradient of ``actual`` more than
    ``GRAD_MULTIPLIER`` times eager's error (+ ``GRAD_FLOOR``) off ``reference``, worst
    first; one entry named ``"(structure)"`` when the lists do not line up."""
    if not len(actual) == len(eager) == len(reference) == len(names):
        return [("(structure)", math.inf, 0.0)]
    out = []
    for name, a, e, r in zip(names, actual, eager, reference):
        err, base = relative_error(a, r), relative_error(e, r)
        if not err <= GRAD_MULTIPLIER * base + GRAD_FLOOR:
            out.append((name, err, base))
    return sorted(out, key=lambda t: -t[1] / max(t[2], 1e-12))


def cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with its floating-point tensors cast to ``dtype`` (nested tuples, lists,
    dicts); other values unchanged."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: cast_floating(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floating(v, dtype) for v in value)
    return value
