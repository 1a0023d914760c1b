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
"""
from __future__ import annotations

from typing import Callable

import torch

from ember import logs


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
