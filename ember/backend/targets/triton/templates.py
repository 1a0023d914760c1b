"""Matmuls with their pointwise epilogue in one kernel (``max_autotune`` on Triton targets).

By default a matmul runs its library kernel (cuBLAS through ATen) and the pointwise ops after
it (bias, activation, residual, cast) run as the next fused kernel, which reads the matmul's
result back from memory. Under ``max_autotune`` the scheduled steps are searched for a
matmul whose only reader is such a kernel; the pair becomes one :class:`MatmulEpilogue`
step. Its target generates a tiled matmul kernel that computes the epilogue on the
accumulator before storing (the matmul's result never reaches memory), and keeps the
library call with the separate epilogue kernel as the other choice: which one runs is timed
per shape on the first call and cached on disk (``launch.MatmulChoice``).

Conditions, each checked here: ``mm`` or ``addmm`` of static 2-D sizes of at least 16 in
every dim, in a dtype the target computes; the epilogue kernel is pointwise over the
matmul's rows x columns (any split of the rows, as a ``view`` of a linear's output gives)
and reads the matmul's result only at the element it computes, and writes none of its
operands; nothing else reads the result, and no step between the two writes the operands.
"""
from __future__ import annotations

import collections
import dataclasses

import sympy
import torch

from ember import logs
from ember.backend.ir import (Buffer, ExternBuffer, ReinterpretView, flat_index, index_vars,
                              product)
from ember.backend.scheduler import FusionGroup, _step_names, node_reads

MATMULS = {torch.ops.aten.mm.default: "mm", torch.ops.aten.addmm.default: "addmm"}
MIN_DIM = 16          # tl.dot's smallest tile side


@dataclasses.dataclass(eq=False)
class MatmulEpilogue(FusionGroup):
    """A fusion group (the epilogue) whose input ``matmul`` is computed inside its kernel."""
    matmul: ExternBuffer | None = None

    @property
    def operands(self) -> dict:
        return matmul_operands(self.matmul)


def matmul_operands(mm: ExternBuffer) -> dict:
    """``a`` [M, K], ``b`` [K, N] and, for addmm, ``bias`` (broadcast to [M, N]), with
    ``alpha`` and ``beta``."""
    if MATMULS[mm.kernel] == "mm":
        a, b = mm.args[:2]
        return {"a": a, "b": b, "bias": None, "alpha": 1, "beta": 1}
    bias, a, b = mm.args[:3]
    return {"a": a, "b": b, "bias": bias, "alpha": mm.kwargs.get("alpha", 1),
            "beta": mm.kwargs.get("beta", 1)}


def fuse_matmul_epilogues(steps: list, output_names: set[str], dtypes: frozenset) -> list:
    """``steps`` with each fusable (matmul, epilogue kernel) pair as one MatmulEpilogue at
    the epilogue's place."""
    readers: dict[str, list] = {}
    for step in steps:
        for name in _step_names(step)[1]:
            readers.setdefault(name, []).append(step)
    out, fused, declined = list(steps), 0, collections.Counter()
    for i, step in enumerate(steps):
        if not (isinstance(step, ExternBuffer) and step.kernel in MATMULS):
            continue
        users = readers.get(step.name, [])
        if step.name in output_names or len(users) != 1 or \
                not isinstance(users[0], FusionGroup):
            continue
        epilogue = users[0]
        j = steps.index(epilogue)
        reason = _why_not(step, epilogue, steps[i + 1:j], dtypes)
        if reason:
            declined[reason] += 1
            continue
        out[out.index(step)] = None
        out[out.index(epilogue)] = MatmulEpilogue(
            epilogue.outer, epilogue.inner, epilogue.nodes, epilogue.local,
            epilogue.kernel_local, epilogue.segments, matmul=step)
        fused += 1
    if fused:
        logs.log("perf_hints", "max_autotune: %d matmuls may run with their epilogue in one "
                 "kernel (timed against the library on the first call)", fused)
    if declined:
        logs.log("perf_hints", "max_autotune: %d matmuls stay library calls (%s)",
                 sum(declined.values()), ", ".join(f"{why}: {n}" for why, n in declined.items()))
    return [s for s in out if s is not None]


def _why_not(mm: ExternBuffer, kernel: FusionGroup, between: list,
             dtypes: frozenset) -> str | None:
    """Why ``mm`` cannot run inside ``kernel``; None when it can."""
    operands = matmul_operands(mm)
    tensors = [v for v in (operands["a"], operands["b"], operands["bias"]) if v is not None]
    if not all(isinstance(t, (Buffer, ReinterpretView)) for t in tensors):
        return "an operand is not in memory"
    if any(len(t.layout.size) > 2 for t in tensors) or mm.layout is None:
        return "not 2-D"
    sizes = [*operands["a"].layout.size, operands["b"].layout.size[-1], *mm.layout.size]
    if not all(isinstance(s, sympy.Integer) for s in sizes):
        return "symbolic sizes"
    if min(int(s) for s in sizes) < MIN_DIM:
        return f"a dim under {MIN_DIM}"
    dtype = mm.layout.dtype
    if dtype not in dtypes or not dtype.is_floating_point or dtype == torch.float64 or \
            any(t.layout.dtype != dtype for t in tensors):
        return f"dtype {dtype}"
    if not all(isinstance(v, (int, float)) for v in (operands["alpha"], operands["beta"])):
        return "alpha or beta is not a number"
    if any(n.role != "inner" or n.perm is not None or n.is_reduction for n in kernel.nodes):
        return "the kernel after it is not pointwise"
    rows, cols = mm.layout.size
    if len(kernel.inner) != 1 or kernel.inner[0] != cols or product(kernel.outer) != rows:
        return "the kernel after it runs over other loops"
    x, r = index_vars("x", len(kernel.outer)), index_vars("r", 1)
    here = sympy.expand(mm.layout.index([flat_index(x, kernel.outer), r[0]]))
    for node in kernel.nodes:
        for name, index in node_reads(node, x, r):
            if name == mm.name and sympy.expand(index) != here:
                return "the kernel after it reads other elements of its result"
    operand_names = {t.name for t in tensors}
    if any(n.writes in operand_names for n in kernel.nodes):
        # other programs would still read the rows a program has overwritten
        return "the kernel after it writes over an operand"
    for step in between:
        if _step_names(step)[0] & operand_names:
            return "an operand is written before the kernel after it"
    return None


