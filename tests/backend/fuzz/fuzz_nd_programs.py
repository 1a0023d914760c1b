"""Random programs over 4-D tensors, compiled and compared with eager, forward and backward:
a fuzz of reductions over any dims, permutes, broadcasting, indexing, scans and graph breaks,
and of the training graphs built from them.

Each seed gives one program: a list of steps, each applied to an earlier value (the two
inputs first). ``train`` also compares the gradients of both inputs for a weighted sum of
the returned values. The tests run fixed seeds (``test_fuzz_nd_programs.py``); for a longer
search:

    python tests/backend/fuzz/fuzz_nd_programs.py FIRST_SEED COUNT [infer|train] [cpp|triton]

(``triton`` needs ``TRITON_INTERPRET=1`` on a machine without a GPU). It prints each seed
whose values, dtype, shape, strides or gradients differ from eager's, or whose compilation
raises. Where values overflow (a product of large values), the order of a sum or product
may turn a finite result into inf or NaN or back: such a difference is float
reassociation, not a bug.
"""
from __future__ import annotations

import math
import random
import sys

import torch
import torch.nn.functional as F

from fuzz_programs import output_difference, search_main

SHAPE = (3, 5, 4, 7)

UNARY = [torch.sin, torch.sigmoid, lambda t: t.abs().add(1).log(), torch.erf, torch.round,
         lambda t: t.clamp(min=0) ** 1.5, torch.tanh,
         # divides by zero (its backward: 0 / 0); the infinities become +-100, not float's
         # largest, whose sums overflow in one order and not in another
         lambda t: torch.nan_to_num(t / (t - 0.5).round(), posinf=100.0, neginf=-100.0),
         F.softplus, F.hardswish]
# (value, dim, other dim) -> value
REDUCE = [lambda t, d, e: t.sum(d, keepdim=True),
          lambda t, d, e: t.amax((d, e), keepdim=True) if d != e else t.amin(d, keepdim=True),
          lambda t, d, e: t.mean(d, keepdim=True), lambda t, d, e: t.var(d, keepdim=True),
          lambda t, d, e: t.norm(dim=d, keepdim=True),
          lambda t, d, e: t.logsumexp(d, keepdim=True),
          lambda t, d, e: t.argmax(d, keepdim=True).float(),
          lambda t, d, e: t.prod(d, keepdim=True).clamp(-10, 10),
          lambda t, d, e: t.softmax(d),
          lambda t, d, e: t + t.sum(d, keepdim=True).amax(e, keepdim=True) * 0.1]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum,
          lambda p, q: torch.where(p > q, p, q), torch.atan2,
          lambda p, q: p / (q.abs() + 0.5), lambda p, q: torch.remainder(p, q.abs() + 0.5),
          lambda p, q: p ** 2 - q]
INDEX = [lambda t, d, e: t.flip(d),
         lambda t, d, e: t.narrow(d, 1, t.shape[d] - 1) if t.shape[d] > 1 else t,
         lambda t, d, e: t.roll(2, d),
         lambda t, d, e: t.select(d, 0).unsqueeze(d).expand_as(t) * 1.0,
         lambda t, d, e: torch.cat([t, t * 2], d),
         lambda t, d, e: torch.where((t > 0.2) & (t < 0.9), t, torch.zeros_like(t))
         + (t < 0).float()]
SCAN = [lambda t, d: t.cumsum(d), lambda t, d: t.cummax(d)[0],
        lambda t, d: (t * 0.1).cumprod(d), lambda t, d: t.sort(d)[0],
        lambda t, d: t.topk(1, d)[0]]
KINDS = ["unary", "reduce", "permute", "binary", "index", "scan", "break"]


def _graph_break(t):
    """A data-dependent branch: the frame breaks, and values flow from one graph to the
    next."""
    return t * 2 if t.sum().item() > 0 else t * 3


def make_program(seed: int):
    """``(fn, description)``: ``fn(x, y)`` returns a tuple of tensors."""
    rng = random.Random(seed)
    steps = []
    for i in range(rng.randint(3, 10)):
        kind = rng.choices(KINDS, [4, 4, 2, 3, 3, 1.5, 1])[0]
        table = {"unary": UNARY, "reduce": REDUCE, "binary": BINARY, "index": INDEX,
                 "scan": SCAN}.get(kind, [None])
        perm = list(range(len(SHAPE)))
        rng.shuffle(perm)
        steps.append((kind, rng.randrange(len(table)), rng.randrange(2 + i),
                      rng.randrange(2 + i), rng.randrange(4), rng.randrange(4), perm))
    count = rng.randint(1, 3)
    backpropagated = rng.randint(1, count)   # the loss may leave the last outputs out

    def fn(x, y):
        values = [x, y]
        for kind, op, a, b, d, e, perm in steps:
            t, u = values[a], values[b]
            d, e = d % t.dim(), e % t.dim()
            if kind == "unary":
                v = UNARY[op](t)
            elif kind == "reduce":
                v = REDUCE[op](t, d, e)
            elif kind == "permute":
                v = t.permute(perm[:t.dim()] if t.dim() == len(perm) else
                              list(reversed(range(t.dim())))) * 1.25
            elif kind == "binary":
                if t.dim() != u.dim() or any(m != n and 1 not in (m, n)
                                             for m, n in zip(t.shape, u.shape)):
                    u = u.sum()              # shapes that do not broadcast: a scalar
                v = BINARY[op](t, u)
            elif kind == "index":
                v = INDEX[op](t, d, e)
            elif kind == "scan":
                v = SCAN[op](t, d)
            else:
                v = _graph_break(t)
            values.append(v)
        return tuple(values[-1 - i] for i in range(count))

    fn.backpropagated = backpropagated
    text = "; ".join(f"v{i + 2} = {kind}[{op}](v{a}{f', v{b}' if kind == 'binary' else ''}"
                     f"{f', {d}, {e}' if kind in ('reduce', 'index', 'scan') else ''})"
                     for i, (kind, op, a, b, d, e, _) in enumerate(steps))
    return fn, f"{text}; return the last {count}, loss of the first {backpropagated}"


def _inputs(seed: int, shape: tuple = SHAPE):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)


def _run(fn, x, y, train: bool, backpropagated: int):
    """Outputs, and with ``train`` the gradients of x and y for a weighted sum of the first
    ``backpropagated`` of them."""
    if not train:
        return fn(x, y), ()
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    outs = fn(x, y)
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum()
               for o in outs[:backpropagated] if o.requires_grad)
    grads = torch.autograd.grad(loss, (x, y), allow_unused=True) \
        if isinstance(loss, torch.Tensor) else (None, None)
    return tuple(o.detach() for o in outs), grads


def difference(seed: int, train: bool = False, options=None) -> str | None:
    """Compile seed's program and run it once: None when every output (and gradient) matches
    eager's, else what differs."""
    import ember
    fn, text = make_program(seed)
    x, y = _inputs(seed)
    expected, expected_grads = _run(fn, x, y, train, fn.backpropagated)
    ember.reset()
    try:
        actual, grads = _run(ember.compile(fn, backend="ember", options=options), x, y, train,
                             fn.backpropagated)
    except Exception as err:                 # noqa: BLE001 -- reported as the difference
        return f"{text}: {type(err).__name__}: {err}"
    outputs = output_difference(text, expected, actual)
    if outputs is not None:
        return outputs
    for name, e, a in zip("xy", expected_grads, grads):
        if (e is None) != (a is None):
            return f"{text}: gradient of {name} is {a is not None and 'a tensor'}, " \
                   f"eager's {e is not None and 'a tensor'}"
        if e is not None and not torch.allclose(a, e, rtol=1e-3, atol=1e-3, equal_nan=True):
            return f"{text}: gradient of {name} differs by {(a - e).abs().max().item():.3g}"
    return None


def _error(value, reference) -> float:
    """Largest absolute error of ``value`` against the float64 ``reference`` where the
    reference is finite (inf where their finite elements differ)."""
    if value is None or reference is None:
        return 0.0
    value, reference = value.double(), reference.double()
    finite = torch.isfinite(reference)
    if not torch.equal(torch.isfinite(value), finite):
        return math.inf
    return (value - reference)[finite].abs().max().item() if finite.any() else 0.0


def float64_difference(seed: int, shape: tuple, train: bool = False, dynamic=None,
                       channels_last: bool = False) -> str | None:
    """Seed's program at ``shape``, judged against float64 (large shapes, where float sums
    of many values differ from eager's by more than a fixed tolerance): None when each
    output's and gradient's error is at most 3x eager's + 1e-4 and dtypes, shapes and strides
    (of dims longer than 1) are eager's, else what differs."""
    import ember
    fn, text = make_program(seed)
    x, y = _inputs(seed, shape)
    if channels_last:
        x, y = (t.to(memory_format=torch.channels_last) for t in (x, y))
    expected, expected_grads = _run(fn, x, y, train, fn.backpropagated)
    exact, exact_grads = _run(fn, x.double(), y.double(), train, fn.backpropagated)
    ember.reset()
    try:
        actual, grads = _run(ember.compile(fn, backend="ember", dynamic=dynamic), x, y,
                             train, fn.backpropagated)
    except Exception as err:                 # noqa: BLE001 -- reported as the difference
        return f"{text}: {type(err).__name__}: {err}"
    for i, (e, d, a) in enumerate(zip(expected, exact, actual)):
        if a.dtype != e.dtype or a.shape != e.shape or any(
                st != se for n, st, se in zip(a.shape, a.stride(), e.stride()) if n > 1):
            return f"{text}: output {i} is {a.dtype}{list(a.shape)} {a.stride()}, " \
                   f"eager's {e.dtype}{list(e.shape)} {e.stride()}"
    pairs = [(f"output {i}", e, d, a) for i, (e, d, a) in enumerate(zip(expected, exact, actual))]
    pairs += [(f"gradient of {n}", e, d, a) for n, e, d, a in zip("xy", expected_grads,
                                                                   exact_grads, grads)]
    for name, e, d, a in pairs:
        if (e is None) != (a is None):
            return f"{text}: {name} is {a is not None and 'a tensor'}, eager's " \
                   f"{e is not None and 'a tensor'}"
        eager_error, error = _error(e, d), _error(a, d)
        if error > 3 * eager_error + 1e-4 and eager_error != math.inf:
            return f"{text}: {name} is {error:.3g} off float64, eager's {eager_error:.3g}"
    return None


if __name__ == "__main__":
    sys.exit(search_main(sys.argv[1:], difference))
