"""Never slower than eager (issue 34): CPU graphs where Ember's generated code is slower than
eager's kernels, or that are only library calls, run eagerly, with ``eager_choice="off"``
(before) and ``"timed"`` (after, the default) side by side with eager. Fastest of N calls;
the first call's time shows what the timing adds (kernels are built beforehand, the choice
is timed afresh in a temporary cache directory).

    PYTHONPATH=. python3 benchmarks/eager_choice.py --threads 1 [--train]

``--train``: training steps (forward, then ``torch.autograd.grad`` of the output with respect
to the inputs that require grad) of single layers where Ember's kernels or its autograd
Function's per-call cost trail eager's.
"""
import argparse
import os
import tempfile
import time

import torch

import ember


def fastest_ms(fn, *args, n=200):
    fn(*args)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def cases():
    x = torch.randn(4096, 1024)
    a, b, c = (torch.randn(512, 512) for _ in range(3))
    return {
        "layer_norm 4096x1024": (torch.nn.LayerNorm(1024), (x,)),
        "softmax 4096x1024": (lambda x: torch.softmax(x, -1), (x,)),
        "argmax 4096x1024": (lambda x: x.argmax(-1), (x,)),
        "two matmuls 512^3 (library calls only)": (lambda a, b, c: (a @ b) @ c, (a, b, c)),
    }


def training_cases():
    def grad(*shape):
        return torch.randn(*shape, requires_grad=True)
    cl = torch.randn(8, 64, 16, 16).to(memory_format=torch.channels_last).requires_grad_()
    return {
        "group_norm 8x64x16x16 (train)": (lambda x, w, b: torch.nn.functional.group_norm(
            x, 8, w, b), (grad(8, 64, 16, 16), grad(64), grad(64))),
        "group_norm 8x64x16x16 channels-last (train)": (
            lambda x, w, b: torch.nn.functional.group_norm(x, 8, w, b),
            (cl, grad(64), grad(64))),
        "layer_norm 2048x256 (train)": (lambda x, w, b: torch.nn.functional.layer_norm(
            x, (256,), w, b), (grad(2048, 256), grad(256), grad(256))),
    }


def training_step(fn):
    def step(*inputs):
        out = fn(*inputs)
        return torch.autograd.grad(out, [t for t in inputs if t.requires_grad],
                                   torch.ones_like(out))
    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("-n", type=int, default=200, help="calls; the fastest counts")
    parser.add_argument("--train", action="store_true", help="training steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-eager-choice-")
    print(f"{args.threads} thread(s), fastest of {args.n}")
    wrap = training_step if args.train else (lambda fn: fn)
    with torch.set_grad_enabled(args.train):
        for name, (fn, inputs) in (training_cases() if args.train else cases()).items():
            ember.reset()
            wrap(ember.compile(fn, options={"eager_choice": "off"}))(*inputs)  # kernels built
            ms, first = {}, {}
            for way in ("off", "timed"):
                ember.reset()
                compiled = wrap(ember.compile(fn, options={"eager_choice": way}))
                start = time.perf_counter()
                compiled(*inputs)
                first[way] = (time.perf_counter() - start) * 1e3
                ms[way] = fastest_ms(compiled, *inputs, n=args.n)
            eager = fastest_ms(wrap(fn), *inputs, n=args.n)
            print(f"{name}: eager {eager:.3f} ms; ember before {ms['off']:.3f} ms "
                  f"({eager / ms['off']:.2f}x eager), after {ms['timed']:.3f} ms "
                  f"({eager / ms['timed']:.2f}x eager); first call {first['off']:.0f} ms "
                  f"before, {first['timed']:.0f} ms after")


if __name__ == "__main__":
    main()
