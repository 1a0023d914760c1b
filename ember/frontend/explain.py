"""``ember.explain(fn)(*args, **kwargs)``: what the frontend made of one call.

The call runs once through a fresh compiled wrapper whose backend runs each graph as
captured; every frame on the way (the function, its resume functions, functions that broke
inside an inlined call and were captured on their own) reports its graphs and breaks here.
"""
from __future__ import annotations

import dataclasses

import torch

from ember.frontend.graph_break import BreakReason


@dataclasses.dataclass
class ExplainOutput:
    graphs: list[torch.fx.GraphModule]
    break_reasons: list[BreakReason]

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        """Breaks that split a frame, and frames that ran eagerly because they could not."""
        return len(self.break_reasons)

    @property
    def dynamic_dims(self) -> list:
        """The input dims captured symbolic, each an ``ember.frontend.dynamic.DynamicDim``
        (source, dim, why: ``dynamic=True``, automatic dynamic, a mark; bounds), per graph
        in order; a dim later specialised by the program is not listed."""
        return [d for gm in self.graphs for d in gm.meta.get("ember_dynamic_dims", ())]

    @property
    def ops_per_graph(self) -> list[list]:
        """Per graph, the targets of its ``call_*`` nodes in order."""
        return [[n.target for n in gm.graph.nodes if n.op.startswith("call_")]
                for gm in self.graphs]

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}",
                 f"Graph break count: {self.graph_break_count}",
                 f"Op count: {sum(len(ops) for ops in self.ops_per_graph)}"]
        if self.dynamic_dims:
            lines.append("Dynamic dims:")
            lines += [f"  {d}" for d in self.dynamic_dims]
        else:
            lines.append("Dynamic dims: none (every size static)")
        if self.break_reasons:
            lines.append("Break reasons:")
            for i, reason in enumerate(self.break_reasons, 1):
                what = "frame ran eagerly" if reason.frame_ran_eagerly else "graph break"
                lines.append(f"  {i}. {what}: {reason.reason}")
                lines.append(f"     at {reason.location}")
                if reason.source_line:
                    lines.append(f"       {reason.source_line}")
        for i, ops in enumerate(self.ops_per_graph, 1):
            names = [getattr(op, "__name__", str(op)) for op in ops]
            lines.append(f"Graph {i}: {len(ops)} ops: {', '.join(names)}")
        return "\n".join(lines)


class Collector:
    """The observer ``graph_break.observe`` calls while the explained call runs."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []
        self.breaks: list[BreakReason] = []

    def __call__(self, kind: str, payload) -> None:
        (self.graphs if kind == "graph" else self.breaks).append(payload)

    def output(self) -> ExplainOutput:
        return ExplainOutput(list(self.graphs), list(self.breaks))
