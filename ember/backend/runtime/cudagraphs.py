"""``mode="reduce-overhead"`` / ``options={"cudagraphs": True}``: replay a compiled CUDA graph's
launches as one captured CUDA graph.

The first call runs the compiled graph once (warm-up: Triton compiles, allocator pools fill),
then captures a second run over *static inputs*. Later calls copy each input into its static
buffer and replay. Decisions:

- Parameters and buffers of modules (``freezing.is_parameter_or_buffer``: batch-norm
  statistics too) are captured by address: copying them every call would cost a launch
  each, more than the replay saves. A call whose parameter or buffer lives elsewhere (the
  module's weight was replaced) captures again. Every other tensor input gets a private
  static buffer and is copied in, so the caller's memory is never written.
- Outputs are cloned out of the graph's memory, which the next replay overwrites: a caller
  may keep results across calls, as in eager.
- Graphs that cannot be captured run without CUDA graphs, with the reason logged
  (``EMBER_LOGS=perf_hints``): CPU tensor inputs, mutated inputs, or a capture that fails
  (an op that synchronises with the host).
- A program compiled once for symbolic sizes (``backend/symbolic.py``) is captured once per
  concrete size (``PerSizeCudaGraphs``): a CUDA graph fixes every launch's grid and every
  buffer's size. The sizes the call passes (its int arguments) key the graphs
  (``per_size.PerSize``); the most recently used ``SIZES_KEPT`` are kept, an older size is
  captured again when it returns.
"""
from __future__ import annotations

from typing import Callable

import torch

from ember import logs
from ember.backend.runtime.per_size import PerSize


class CudaGraphRunner:
    def __init__(self, compiled: Callable, example_inputs: list,
                 module_state: list[bool] | None = None):
        self.compiled = compiled
        # per input: a module's parameter or buffer (captured by address)
        self.module_state = module_state or [isinstance(a, torch.nn.Parameter)
                                             for a in example_inputs]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list = []
        self.static_outputs = None
        self.by_address: list[bool] = []
        self.fixed: list[int] = []
        self.copied: list[int] = []
        self.disabled = False

    def __call__(self, *args):
        if self.disabled:
            return self.compiled(*args)
        if self.graph is None or not self._addresses_hold(args):
            if not self._capture(args):
                return self.compiled(*args)
        for i in self.copied:
            self.static_inputs[i].copy_(args[i])
        self.graph.replay()
        return tuple(o.clone() if isinstance(o, torch.Tensor) else o
                     for o in self.static_outputs)

    def _addresses_hold(self, args) -> bool:
        return all(args[i].data_ptr() == self.static_inputs[i].data_ptr() for i in self.fixed)

    def _capture(self, args) -> bool:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(t.device.type != "cuda" for t in tensors):
            return self._decline("a graph input is not on the GPU")
        self.by_address = [isinstance(a, torch.Tensor) and (
            isinstance(a, torch.nn.Parameter) or (i < len(self.module_state) and
                                                  self.module_state[i]))
            for i, a in enumerate(args)]
        # per call: parameters' addresses checked, other tensors copied in
        self.fixed = [i for i, f in enumerate(self.by_address) if f]
        self.copied = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
                       and not self.by_address[i]]
        self.static_inputs = [
            a if fixed or not isinstance(a, torch.Tensor) else
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)
            for a, fixed in zip(args, self.by_address)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):     # warm-up off the capture
                self.compiled(*self.static_inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.static_outputs = self.compiled(*self.static_inputs)
        except Exception as e:   # an op that cannot be captured: run as compiled
            torch.cuda.synchronize()
            return self._decline(f"capture failed ({type(e).__name__}: {e})")
        self.graph = graph
        logs.log("perf_hints", "cudagraphs: captured %d inputs (%d parameters and buffers by "
                               "address)",
                 len(args), sum(self.by_address))
        return True

    def _decline(self, why: str) -> bool:
        logs.log("perf_hints", "cudagraphs: not used, %s; running the compiled graph", why)
        self.disabled = True
        self.static_inputs = []
        return False


SIZES_KEPT = 8


class PerSizeCudaGraphs(PerSize):
    """A symbolic program replayed as one CUDA graph per size (module docstring)."""

    def __init__(self, compiled: Callable, module_state: list[bool], limit: int | None = None):
        super().__init__(lambda args: CudaGraphRunner(compiled, list(args), module_state),
                         SIZES_KEPT if limit is None else limit, "cudagraphs")


def replay(compiled: Callable, gm, example_inputs: list, *, training: bool = False,
           per_size: bool = False) -> Callable:
    """``cudagraphs=True``: ``compiled`` replayed as CUDA graphs (one per size over a
    symbolic program: ``per_size``), or ``compiled`` itself, said, where it records
    gradients or writes its inputs."""
    if training:
        logs.log("perf_hints", "cudagraphs: not used, the graph records gradients (CUDA "
                               "graphs replay inference graphs only)")
        return compiled
    if getattr(compiled, "mutates_inputs", False):
        logs.log("perf_hints", "cudagraphs: not used, the graph mutates its inputs")
        return compiled
    from ember.backend.passes.freezing import is_parameter_or_buffer
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    module_state = [is_parameter_or_buffer(node, value)
                    for node, value in zip(placeholders, example_inputs)]
    if per_size:
        return PerSizeCudaGraphs(compiled, module_state)
    return CudaGraphRunner(compiled, example_inputs, module_state)
