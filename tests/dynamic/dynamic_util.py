"""Shared by the dynamic-shapes tests: a backend that records what it is handed."""
import torch


class Recorder:
    """A backend keeping (graph, example inputs) of each compile; runs the graph as is."""

    def __init__(self):
        self.calls = []

    def __call__(self, gm, example_inputs):
        self.calls.append((gm, list(example_inputs)))
        return gm.forward

    @property
    def count(self):
        return len(self.calls)

    def symbolic_dims(self, i=-1):
        """{placeholder name: [dims whose fake size is symbolic]} of graph ``i``."""
        gm, _ = self.calls[i]
        out = {}
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            if node.op == "placeholder" and isinstance(val, torch.Tensor):
                out[node.target] = [d for d, s in enumerate(val.shape)
                                    if isinstance(s, torch.SymInt)
                                    and s.node.expr.free_symbols]
        return out
