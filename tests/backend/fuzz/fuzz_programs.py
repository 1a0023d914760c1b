"""Random tensor programs, compiled and compared with eager: a fuzz of fusion, scheduling,
memory reuse and output layouts. Each seed gives one program: a DAG of pointwise, reduction,
view and binary steps over two inputs, some of whose values are returned.

The tests run fixed seeds (``test_fuzz_programs.py``); for a longer search:

    python tests/backend/fuzz/fuzz_programs.py FIRST_SEED COUNT [cpp|triton] [ROWSxCOLS]

(``triton`` needs ``TRITON_INTERPRET=1`` on a machine without a GPU). It prints each seed
whose result, dtype, shape or strides differ from eager's, or whose compilation raises.
"""
from __future__ import annotations

import random
import sys

import torch
import torch.nn.functional as F

UNARY = {
    "relu": torch.relu, "exp": lambda a: a.clamp(max=5).exp(), "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "neg": torch.neg, "abs": torch.abs, "silu": F.silu,
    "gelu": F.gelu, "sqrt_abs": lambda a: a.abs().sqrt(), "square": lambda a: a * a,
    "leaky": lambda a: torch.where(a > 0, a, a * 0.1), "clamp": lambda a: a.clamp(-0.5, 0.7),
}
ROWWISE = {
    "softmax": lambda a: a.softmax(-1), "log_softmax": lambda a: a.log_softmax(-1),
    "minus_max": lambda a: a - a.amax(-1, keepdim=True),
    "minus_mean": lambda a: a - a.mean(-1, keepdim=True),
    "layer_norm": lambda a: F.layer_norm(a, a.shape[-1:]),
    "cumsum": lambda a: a.cumsum(-1) / a.shape[-1],
    "over_std": lambda a: a / (a.var(-1, keepdim=True) + 1).sqrt(),
    "minus_col_sum": lambda a: a - a.sum(0, keepdim=True) / a.shape[0],
    "minus_col_min": lambda a: a - a.amin(0, keepdim=True),
}
VIEWS = {
    "transpose": lambda a: a.t().contiguous().t() * 1.5,
    "flip": lambda a: a.flip(-1),
    "roll": lambda a: a.roll(1, 0),
    "cat": lambda a: torch.cat([a[:, 1:], a[:, :1] * 2], -1),
    "pad_slice": lambda a: F.pad(a, (1, 2))[:, 2:-1],
    "gather": lambda a: a.gather(-1, (torch.arange(a.shape[-1]) * 7 + 3).remainder(
        a.shape[-1]).expand_as(a).contiguous()),
}
BINARY = {
    "add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum,
    "where": lambda a, b: torch.where(a > b, a, b * 0.5),
    "div": lambda a, b: a / (b.abs() + 1),
}
# a value returned may also be a view of one
OUTPUT_VIEWS = {"same": lambda a: a, "row": lambda a: a[1], "step": lambda a: a[:, ::2],
                "t": lambda a: a.t()}


def make_program(seed: int):
    """``(fn, description)``: ``fn(x, y)`` returns a tuple of tensors."""
    rng = random.Random(seed)
    steps = []
    for _ in range(rng.randint(3, 12)):
        kind = rng.choices(["unary", "rowwise", "view", "binary"], [4, 3, 1.5, 3])[0]
        table = {"unary": UNARY, "rowwise": ROWWISE, "view": VIEWS, "binary": BINARY}[kind]
        available = 2 + len(steps)
        steps.append((kind, rng.choice(sorted(table)), rng.randrange(available),
                      rng.randrange(available)))
    made = range(2, 2 + len(steps))
    outputs = sorted(rng.sample(made, min(len(steps), rng.randint(1, 3))))
    views = [rng.choice(sorted(OUTPUT_VIEWS)) for _ in outputs]

    def fn(x, y):
        values = [x, y]
        for kind, name, a, b in steps:
            if kind == "binary":
                values.append(BINARY[name](values[a], values[b]))
            else:
                table = {"unary": UNARY, "rowwise": ROWWISE, "view": VIEWS}[kind]
                values.append(table[name](values[a]))
        return tuple(OUTPUT_VIEWS[v](values[o]) for o, v in zip(outputs, views))

    text = "; ".join(f"v{i + 2} = {name}(v{a}{', v%d' % b if kind == 'binary' else ''})"
                     for i, (kind, name, a, b) in enumerate(steps))
    return fn, f"{text}; return {', '.join(f'{v}(v{o})' for o, v in zip(outputs, views))}"


def difference(seed: int, rows: int = 12, cols: int = 40, options=None) -> str | None:
    """Compile seed's program and run it once on fresh inputs: None when every output
    matches eager's (values within float32 rounding, dtype, shape, strides), else what
    differs."""
    import ember
    fn, text = make_program(seed)
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows, cols, generator=gen), torch.randn(rows, cols, generator=gen)
    expected = fn(x, y)
    ember.reset()
    try:
        actual = ember.compile(fn, backend="ember", options=options)(x, y)
    except Exception as e:                   # noqa: BLE001 -- reported as the difference
        return f"{text}: {type(e).__name__}: {e}"
    return output_difference(text, expected, actual)


def output_difference(text: str, expected, actual) -> str | None:
    """What differs between eager's outputs and Ember's (values within float32 rounding,
    dtype, shape, strides over dims longer than 1), or None."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if a.dtype != e.dtype or a.shape != e.shape:
            return f"{text}: output {i} is {a.dtype}{list(a.shape)}, eager's " \
                   f"{e.dtype}{list(e.shape)}"
        if not torch.allclose(a, e, rtol=1e-4, atol=1e-4, equal_nan=True):
            return f"{text}: output {i} differs by {(a - e).abs().max().item():.3g}"
        if any(st != se for n, st, se in zip(a.shape, a.stride(), e.stride()) if n > 1):
            return f"{text}: output {i} has strides {a.stride()}, eager's {e.stride()}"
    return None


def main(argv: list[str]) -> int:
    first, count = int(argv[0]), int(argv[1])
    options = {"cpu_backend": argv[2]} if len(argv) > 2 else None
    rows, cols = map(int, argv[3].split("x")) if len(argv) > 3 else (12, 40)
    return search(lambda seed: difference(seed, rows, cols, options), first, count)


def search_main(argv: list[str], difference) -> int:
    """The command line of the fuzzers with gradients: ``FIRST COUNT [infer|train]
    [cpp|triton]``, searched with ``difference(seed, train, options)``."""
    first, count = int(argv[0]), int(argv[1])
    train = len(argv) > 2 and argv[2] == "train"
    options = {"cpu_backend": argv[3]} if len(argv) > 3 else None
    return search(lambda seed: difference(seed, train, options), first, count)


def search(difference_of, first: int, count: int) -> int:
    """Print each seed in ``first .. first + count - 1`` whose program differs from eager
    (``difference_of(seed)`` says how, or None), compiling strictly; 1 if any did."""
    from ember import config
    found = 0
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        for seed in range(first, first + count):
            diff = difference_of(seed)
            if diff is not None:
                found += 1
                print(f"seed {seed}: {diff}", flush=True)
    print(f"{found} of {count} programs differ from eager")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
