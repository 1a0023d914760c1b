"""Names of generated kernels: what a profile shows, so they say what the kernel computes.

    ember_red_add_layer_norm_4     ember_per_softmax_1     ember_poi_gelu_mul_7

``ember_<kind>_<ops>_<index>``: the kind is the kernel's loop structure (``Kernel.kind``:
``poi`` pointwise, ``red`` a reduction that loops over its rows, ``per`` a persistent
reduction that keeps whole rows in registers, ``mm`` a matmul with its epilogue, ``sca`` a
sequential scatter); the ops are the ATen ops whose values the kernel computes
(``Buffer.origins``, recorded by the lowering: a decomposed op by the op it came from,
``native_layer_norm`` rather than its mean, sub and rsqrt), in program order, shortened,
views and copies left out unless that is all the kernel does; the index is the kernel's
number in its program, so names never collide.

Design: a kernel is generated under ``PROVISIONAL_NAME`` and renamed once generated (the
kind of a Triton reduction is decided while generating), and only when it is the first of
its computation: repeated layers still launch one kernel, named after the first.
"""
from __future__ import annotations

import re

PROVISIONAL_NAME = "ember_kernel"     # while generating (``pipeline._computation_key``'s too)
MAX_OPS = 4
MAX_OPS_CHARS = 48
# results that are their input, moved or cast: a kernel is rarely named after them
_COPIES = {"clone", "copy", "to_copy", "unsafe_view", "contiguous", "lift_fresh_copy"}


def loop_kind(group) -> str:
    """``poi``, ``red`` or ``sca``: a fusion group's loop structure (scheduler.FusionGroup)."""
    if any(node.role == "scatter" for node in group.nodes):
        return "sca"
    return "red" if any(node.is_reduction for node in group.nodes) else "poi"


def step_origins(group) -> list:
    """The ops a fusion group computes (``Buffer.origins``), a fused matmul's first."""
    matmul = getattr(group, "matmul", None)      # (targets/triton/templates.MatmulEpilogue)
    return [*(matmul.origins if matmul is not None else ()),
            *(op for node in group.nodes for op in node.buf.origins)]


def op_word(target) -> str:
    """``aten.native_layer_norm.default`` -> ``layer_norm``; ``_softmax`` -> ``softmax``."""
    schema = getattr(target, "_schema", None)
    name = schema.name.split("::")[-1] if schema is not None else \
        getattr(target, "__name__", type(target).__name__)
    name = re.sub(r"\W+", "_", name).strip("_")
    name = re.sub(r"^native_", "", name)
    name = re.sub(r"_legit.*$", "", name)      # _native_batch_norm_legit_no_training
    return name.replace("backward", "bwd")


def _is_view_or_copy(target) -> bool:
    return bool(getattr(target, "is_view", False)) or op_word(target) in _COPIES or \
        not hasattr(target, "_schema")       # operator.getitem and kin


def kernel_name(kind: str, origins, index: int) -> str:
    """The name of the ``index``-th kernel of a program, of ``kind``, computing the values
    of the ops ``origins`` (ATen op overloads, in program order, repeats allowed)."""
    ops = list(dict.fromkeys(origins))
    computing = [op for op in ops if not _is_view_or_copy(op)] or ops
    words: list[str] = []
    for word in dict.fromkeys(op_word(op) for op in computing):
        if len(words) == MAX_OPS or (words and len("_".join([*words, word])) > MAX_OPS_CHARS):
            break
        if word:
            words.append(word[:MAX_OPS_CHARS].rstrip("_"))
    return "_".join(["ember", kind, *(words or ["copy"]), str(index)])
