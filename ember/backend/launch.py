"""Launching generated Triton kernels cheaply, and compiling them ahead of the first call.

``kernel[grid](*args, XBLOCK=...)`` goes through Triton's generic launcher, which binds
arguments, computes a specialization key and looks up its cache on every call: tens of µs
of Python per launch, which on a GPU is longer than most fused kernels run. A
:class:`TritonLauncher` takes that path once (it compiles the kernel); later calls go
straight to the compiled kernel's C launcher with the grid, the stream and the packed
metadata prepared: the arguments are the only per-call work. The kernel's arguments are
always whole buffers (offsets of views are in the kernel's indices), allocated with the
alignment Triton specialised on, so the compiled kernel stays valid for every call.

If the fast path does not work with the installed Triton (its launcher's arguments differ
between versions), the launcher logs why and keeps the generic path.

:func:`precompile` compiles a graph's kernels before its first call, in parallel threads
(Triton's compiler spends most of its time in native code); each compiled kernel also lands
in Triton's on-disk cache, so a later process loads it without compiling.
"""
from __future__ import annotations

import concurrent.futures
import os

import torch

from ember import logs


class TritonLauncher:
    """``launcher(*buffers)`` runs one generated kernel over a fixed grid and config."""

    def __init__(self, fn, grid: int, config: dict[str, int], interpret: bool):
        self.fn = fn
        self.grid = grid
        self.config = dict(config)
        self.constexprs = tuple(v for k, v in config.items() if k != "num_warps")
        self.interpret = interpret
        self.fast = None
        self.checked = False       # the fast path has launched once without error

    def __call__(self, *args):
        if self.grid == 0:
            return
        if self.fast is not None:
            if self.checked:
                return self.fast(*args)
            try:
                self.fast(*args)
                self.checked = True
                return
            except TypeError as e:      # its arguments are not this Triton's
                logs.log("perf_hints", "triton: direct launch unavailable (%s); using "
                                       "Triton's launcher", e)
                self.fast = None
        compiled = self.fn[(self.grid,)](*args, **self.config)
        if not self.interpret and compiled is not None and not self.checked:
            self.fast = self._fast_path(compiled, args)

    def warmup(self, args) -> None:
        """Compile for ``args`` (tensors like the real ones) without launching."""
        self.fn.warmup(*args, grid=(self.grid,), **self.config)

    def _fast_path(self, compiled, args):
        try:
            run, function = compiled.run, compiled.function
            packed = compiled.packed_metadata
            stream_of = torch._C._cuda_getCurrentRawStream
            device = args[0].device.index if args else torch.cuda.current_device()
            grid, consts = self.grid, self.constexprs

            def launch(*a):
                run(grid, 1, 1, stream_of(device), function, packed, None, None, None,
                    *a, *consts)
            return launch
        except AttributeError as e:    # another Triton's compiled kernel: the generic path
            logs.log("perf_hints", "triton: direct launch unavailable (%s: %s)",
                     type(e).__name__, e)
            return None


def precompile(launchers: dict, example_args: dict) -> None:
    """Compile every kernel (name -> launcher) for its example arguments, in parallel."""
    items = [(launcher, example_args[name]) for name, launcher in launchers.items()
             if launcher.grid > 0 and name in example_args]
    if len(items) < 2:
        return
    workers = min(len(items), os.cpu_count() or 1, 16)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(launcher.warmup, args) for launcher, args in items]:
            future.result()
