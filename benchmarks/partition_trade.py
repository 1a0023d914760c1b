"""Saving library calls' inputs against recomputing them (``aot/partition.py``,
``SAVES_LIBRARY_INPUTS``), in one process: each model's AMP training step (float32 weights,
bf16 autocast), eager and Ember once per setting, timed alternating (median ms and host ms of
``--iters`` rounds), with each Ember variant's GPU busy time, launches, peak memory and
gradients' relative error against eager's.

    PYTHONPATH=. python3 benchmarks/partition_trade.py [--models resnet50,vit_base,gpt2] \\
        [--iters 20] [--device cuda]

The question: resnet50's backward recomputes each convolution's input (a ReLU of a batch
norm) and stores it again for ``convolution_backward``; saving it costs memory held until the
backward. The graph cache is off, so each variant is compiled under its own setting.
``--device cpu --models convnet`` is a smoke test of the script.
"""
from __future__ import annotations

import argparse
import copy
import os

os.environ["EMBER_GRAPH_CACHE"] = "0"

import torch  # noqa: E402

import ember  # noqa: E402
from benchmarks.profile_models import kernel_profile  # noqa: E402
from ember.aot import partition  # noqa: E402
from ember.bench import accuracy, harness, zoo  # noqa: E402


def _grads(params) -> list[torch.Tensor]:
    return [p.grad.detach().float().clone() for p in params if p.grad is not None]


def _relative_error(got: list, want: list) -> float:
    return max(accuracy.relative_errors(got, want), default=0.0)


def measure(name: str, iters: int, device: torch.device) -> None:
    model, inputs = zoo.build_model(name, device, mode="train", amp=torch.bfloat16)
    steps = {"eager": harness._Step(model, inputs, "train", harness._trainable(model))}
    steps["eager"]()
    want = _grads(steps["eager"].params)
    for saves in (False, True):
        partition.SAVES_LIBRARY_INPUTS = saves
        copied = copy.deepcopy(model)
        step = harness._Step(ember.compile(copied), inputs, "train",
                             harness._trainable(copied))
        step()                         # compiled here, under this setting
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        step()
        peak = torch.cuda.max_memory_allocated() / 2 ** 20 if device.type == "cuda" else 0.0
        err = _relative_error(_grads(step.params), want)
        _, launches, busy = kernel_profile(lambda: step(), (), device, 3, 1)
        label = f"ember saves={saves}"
        print(f"{name} {label}: launches {launches:.0f}, busy {busy:.3f} ms, peak "
              f"{peak:.0f} MB, gradients' rel. error vs eager {err:.1e}",
              flush=True)
        steps[label] = step
    partition.SAVES_LIBRARY_INPUTS = False
    times = harness.time_calls(steps, device, iters, 3)
    for k, (ms, host) in times.items():
        print(f"{name} {k}: {ms:.3f} ms, host {host:.3f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vit_base,gpt2")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    for name in args.models.split(","):
        try:
            measure(name, args.iters, device)
        except Exception as e:     # one model's failure (out of memory) leaves the others
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
