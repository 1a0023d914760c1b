"""Column sums on a GPU (a layer norm backward's weight and bias gradients: sums over the
rows of ``g * (x - mean) * rstd`` and of ``g``), Ember's Triton kernels at several tile
sizes (``kernel.COLUMN_XBLOCK`` x ``COLUMN_TILE / COLUMN_XBLOCK`` rows per loop step,
``num_warps`` from the tile) beside eager and torch.compile, with the bandwidth each reaches.
ViT-base's training step ran these at about half torch.compile's bandwidth (0.57 against
0.27 ms for 24); the guess is register pressure (three [XBLOCK, RBLOCK] accumulators).

    PYTHONPATH=. python3 benchmarks/column_reduction.py [--rows 6304] [--cols 768]

``--device cpu`` smoke-tests the script (Triton's interpreter; its timings mean nothing).
"""
import argparse
import itertools
import os

import torch

import ember
from benchmarks.profile_models import median_ms
from ember.backend.targets.triton import kernel as triton_kernel


os.environ["EMBER_GRAPH_CACHE"] = "0"     # the tile constants are not part of its key


def weight_grads(g, x, mean, rstd):
    xhat = (x - mean) * rstd
    return (g * xhat).sum(0), g.sum(0), (g * 2).sum(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6304)
    parser.add_argument("--cols", type=int, default=768)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    n, c, dev = args.rows, args.cols, args.device
    options = {"cpu_backend": "triton"} if dev == "cpu" else {}
    g, x = (torch.randn(n, c, device=dev) for _ in range(2))
    mean, rstd = torch.randn(n, 1, device=dev), torch.rand(n, 1, device=dev) + 0.5
    inputs = (g, x, mean, rstd)
    moved = 2 * n * c * 4 + 2 * n * 4      # g and x read once, mean and rstd once
    expected = weight_grads(*inputs)

    def report(name, fn):
        ms = median_ms(fn, device=dev, iters=20 if dev == "cuda" else 2)
        got = fn()
        err = max((a - b).abs().max().item() for a, b in zip(got, expected))
        print(f"{name:32s} {ms * 1e3:8.1f} us  {moved / ms / 1e9:7.0f} GB/s  max err {err:.1e}",
              flush=True)
    report("eager", lambda: weight_grads(*inputs))
    for xblock, tile in itertools.product((32, 64, 128), (512, 1024, 2048, 4096)):
        if tile < xblock:
            continue
        triton_kernel.COLUMN_XBLOCK, triton_kernel.COLUMN_TILE = xblock, tile
        ember.reset()
        compiled = ember.compile(weight_grads, options=options)
        report(f"ember XBLOCK={xblock} tile={tile}", lambda: compiled(*inputs))
    if dev == "cuda":
        compiled = torch.compile(weight_grads)
        report("torch.compile", lambda: compiled(*inputs))


if __name__ == "__main__":
    main()
