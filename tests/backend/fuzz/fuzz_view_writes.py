"""Random programs that write through views of a computed value: a value in some eager
layout (transposed, permuted, strided, contiguous), then slice assignments, ``index_put``,
``add_`` on a column, ``fill_`` of a row, ``copy_`` of a block, ``mul_`` of a slice,
``diagonal().fill_``, ``sub_`` on a narrowed range; it and views of it are returned. The
tests run fixed seeds (``test_fuzz_view_writes.py``); for a longer search:

    python tests/backend/fuzz/fuzz_view_writes.py FIRST_SEED COUNT [infer|train] [cpp|triton]

Functionalised, these writes become ``as_strided_scatter`` and kin, which address eager's
layout of the value: the bug they found (3e15b5c) wrote other elements than eager's.
"""
from __future__ import annotations

import random
import sys

import torch

from fuzz_programs import output_difference, search_main

BASES = {
    "transposed": lambda x: x.t() * 3,
    "permuted": lambda x: x.permute(1, 0) + 1,
    "strided": lambda x: x[1:, ::2] * 1.5,
    "broadcast_clone": lambda x: x[:1].expand(x.shape[0], -1).clone() * 2,
    "plain": lambda x: x * 2,
}


def _write(kind: str, y: torch.Tensor, v: torch.Tensor) -> None:
    r, c = y.shape
    if kind == "slice_assign":
        y[1:r - 1, 1:c - 1] = 0.5
    elif kind == "slice_tensor":
        y[:2, :3] = v[:2, :3]
    elif kind == "column_add":
        y[:, 1].add_(v[0, :r])
    elif kind == "row_fill":
        y[0].fill_(-1.0)
    elif kind == "block_copy":
        y[-2:, -2:].copy_(v[:2, :2] * 2)
    elif kind == "index_put":
        y[torch.tensor([0, r - 1])] = 3.0
    elif kind == "step_assign":
        y[::2, 1::2] = 4.0
    elif kind == "slice_mul":
        y[1:].mul_(1.5)
    elif kind == "diagonal_fill":
        y.diagonal().fill_(9.0)
    else:                                   # narrow_sub
        y.narrow(1, 1, 2).sub_(v[:r, :2])


WRITES = ["slice_assign", "slice_tensor", "column_add", "row_fill", "block_copy",
          "index_put", "step_assign", "slice_mul", "diagonal_fill", "narrow_sub"]


def make_program(seed: int):
    """``(fn, inputs, description)``; ``fn(x, v)`` returns a tuple of tensors."""
    rng = random.Random(seed)
    base = rng.choice(sorted(BASES))
    writes = [rng.choice(WRITES) for _ in range(rng.randint(1, 4))]
    views = rng.random() < 0.5
    shape = rng.choice([(6, 8), (4, 10), (8, 6), (5, 5)])

    def fn(x, v):
        y = BASES[base](x)
        for kind in writes:
            _write(kind, y, v)
        return (y, y[1:, :2], y.t()) if views else (y,)
    gen = torch.Generator().manual_seed(seed)
    inputs = (torch.randn(*shape, generator=gen), torch.randn(10, 10, generator=gen))
    return fn, inputs, f"{base}, then {', '.join(writes)}{', views returned' * views}"


def difference(seed: int, train: bool = False, options=None) -> str | None:
    """Compile seed's program and run it once: None when every output (and with ``train``
    each input's gradient) matches eager's, else what differs."""
    import ember
    fn, inputs, text = make_program(seed)

    def run(f):
        args = [t.clone().requires_grad_(train) for t in inputs]
        with torch.set_grad_enabled(train):
            outs = f(*args)
        if not train:
            return outs, []
        weights = [torch.arange(o.numel(), dtype=o.dtype).view(o.shape) for o in outs]
        loss = sum((o * w).sum() for o, w in zip(outs, weights))
        grads = torch.autograd.grad(loss, args, allow_unused=True)
        return [o.detach() for o in outs], [g for g in grads if g is not None]
    try:
        expected, expected_grads = run(fn)
    except RuntimeError:     # eager refuses (a saved value written in place): not a program
        return None
    ember.reset()
    try:
        actual, actual_grads = run(ember.compile(fn, backend="ember", options=options))
    except Exception as e:                   # noqa: BLE001 -- reported as the difference
        return f"{text}: {type(e).__name__}: {e}"
    return output_difference(text, expected, actual) or \
        output_difference(f"{text} (gradients)", expected_grads, actual_grads)


if __name__ == "__main__":
    sys.exit(search_main(sys.argv[1:], difference))
