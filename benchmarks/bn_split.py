"""Batch norm + ReLU training steps (forward and backward) over channels-last bf16 data at
resnet50's shapes (batch 64), Ember's split reductions under several limits beside eager
and torch.compile, in one process.

On an H100 resnet50's AMP step spent 3.8 ms in Ember's generated reductions against
torch.compile's 2.9: the statistics kernel of 64x256x56x56 took 82 us (torch.compile 37),
and a backward sum over 64x256x14x14 took 52-66 us, where reading its inputs takes under
10: that reduction splits into only 32 chunks (``SPLIT_MIN_CHUNK``: each at least 256
rows), 128 programs for 132 SMs. Each variant sets split limits
(``SPLIT_PARTIALS``) and column tiles (``COLUMN_TILE``, ``COLUMN_WELFORD_TILE``,
``COLUMN_MIN_PROGRAMS``); the table gives the GPU's busy microseconds per step (the sum of its
kernels' times: a step's wall time is the host's, these steps being small) and the bandwidth
of the bytes a step must move (x read twice, the gradient once, y and dx written: 5 passes
of bf16). ``--kernels`` also lists each variant's kernels; ``--dump DIR`` writes the default
variant's generated code below DIR (``ember.config.debug_dir``).

    PYTHONPATH=. python3 benchmarks/bn_split.py [--shapes 256x56,256x14]

``--device cpu`` smoke-tests the script (Triton's interpreter, float32, small batch).
"""
import argparse
import os

os.environ["EMBER_GRAPH_CACHE"] = "0"     # the limits below are not part of its key

import torch   # noqa: E402
import torch.nn.functional as F   # noqa: E402

import ember   # noqa: E402
from benchmarks.profile_models import kernel_profile, median_ms   # noqa: E402
from ember import config   # noqa: E402
from ember.backend.lowering import reductions   # noqa: E402
from ember.backend.targets.triton import kernel as triton_kernel   # noqa: E402

SHAPES = "64x112,64x56,256x56,128x28,512x28,256x14,1024x14,2048x7"
# (label, settings): module constants of lowering/reductions.py (SPLIT_*) and of the Triton
# kernel (COLUMN_*); the first is the default, restored after each shape
VARIANTS = [
    ("ember", {}),
    ("partials 128K tile 64x8", {"SPLIT_PARTIALS": 131072, "COLUMN_TILE": 512,
                                 "COLUMN_WELFORD_TILE": 512}),
    ("partials 128K 64x8, >= 32 programs", {"SPLIT_PARTIALS": 131072, "COLUMN_TILE": 512,
                                            "COLUMN_WELFORD_TILE": 512,
                                            "COLUMN_MIN_PROGRAMS": 32}),
    ("partials 128K 64x16, >= 32 programs", {"SPLIT_PARTIALS": 131072, "COLUMN_TILE": 1024,
                                             "COLUMN_WELFORD_TILE": 1024,
                                             "COLUMN_MIN_PROGRAMS": 32}),
    ("partials 64K, >= 32 programs", {"SPLIT_PARTIALS": 65536, "COLUMN_MIN_PROGRAMS": 32}),
    (">= 32 programs", {"COLUMN_MIN_PROGRAMS": 32}),
]
_MODULES = {"SPLIT": reductions, "COLUMN": triton_kernel}
DEFAULTS = {name: getattr(_MODULES[name.split("_")[0]], name)
            for _, settings in VARIANTS for name in settings}


def apply(settings: dict) -> None:
    """The variant's constants set, every other one at its default."""
    for name, default in DEFAULTS.items():
        setattr(_MODULES[name.split("_")[0]], name, settings.get(name, default))


def step_fn(weight, bias, mean, var):
    def step(x, g):
        y = F.relu(F.batch_norm(x, mean, var, weight, bias, training=True))
        return torch.autograd.grad(y, (x, weight, bias), g)
    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES, help="CxHW pairs, comma-separated")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="list each variant's kernels")
    parser.add_argument("--dump", default="", help="write the default variant's code here")
    args = parser.parse_args()
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    options = {"cpu_backend": "triton"} if dev == "cpu" else {}
    iters = 20 if dev == "cuda" else 1
    names = ["eager"] + [v[0] for v in VARIANTS] + \
        ([] if args.no_torch_compile or dev == "cpu" else ["torch.compile"])
    print("shape           " + "".join(f"{n:>30s}" for n in names), flush=True)
    for shape in args.shapes.split(","):
        c, hw = (int(v) for v in shape.split("x"))
        x = torch.randn(args.batch, c, hw, hw, device=dev, dtype=dtype)
        x = x.to(memory_format=torch.channels_last).requires_grad_()
        g = torch.randn_like(x)
        params = [torch.randn(c, device=dev, requires_grad=True) for _ in range(2)]
        stats = [torch.zeros(c, device=dev), torch.ones(c, device=dev)]
        step = step_fn(*params, *stats)
        moved = 5 * x.numel() * x.element_size()
        expected = step(x, g)
        cells = []

        listings = []

        def report(name, fn):
            err = max((a.float() - b.float()).abs().max().item()
                      for a, b in zip(fn(x, g), expected))
            if dev == "cuda":
                median_ms(fn, x, g, iters=3, device=dev)     # compiled and warm
                kernels, _, ms = kernel_profile(fn, (x, g), torch.device(dev), iters, 12)
                listings.append((name, kernels))
            else:
                ms = median_ms(fn, x, g, iters=iters, device=dev)
            cells.append(f"{ms * 1e3:7.1f} us {moved / ms / 1e6:5.0f} GB/s {err:5.0e}")
        report("eager", step)
        for k, (label, settings) in enumerate(VARIANTS):
            apply(settings)
            ember.reset()
            config.debug_dir = args.dump if k == 0 else ""
            report(label, ember.compile(step, options=options))
            config.debug_dir = ""
        if "torch.compile" in names:
            report("torch.compile", torch.compile(step))
        print(f"{args.batch}x{c}x{hw}x{hw}".ljust(16) + "".join(f"{s:>30s}" for s in cells),
              flush=True)
        for name, kernels in listings if args.kernels else ():
            print(f"   {name}: " + ", ".join(f"{k.name[:60]} {k.ms * 1e3:.1f} us x{k.calls:g}"
                                          for k in kernels), flush=True)
        apply({})


if __name__ == "__main__":
    main()
