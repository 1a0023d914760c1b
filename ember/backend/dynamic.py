"""Graphs with symbolic sizes (issue 31): one compiled program for every size, or one per
size where the symbolic path declines.

    compiled = compile_dynamic(gm, example_inputs, options)   # compiled(*ints_and_tensors)

The backend contract for such graphs (torch.compile's frontend hands them over, and Ember's
follows the same convention): every free size symbol is a placeholder of its own whose
example input is a ``torch.SymInt`` (over torch's ShapeEnv, or over ``ember.shapes``'s);
tensor placeholders get real tensors, their symbolic fakes in ``node.meta["val"]`` (Ember's
frontend) or ``node.meta["example_value"]`` (torch's). At run time the graph is called with
plain ints for the symbols and real tensors; sizes inside the graph come from the symbol
placeholders through operator nodes (``s27 // 2``).

Decisions
---------
* **Symbolic first, per size as the floor.** ``compile_dynamic`` compiles the graph once
  with symbolic sizes (``symbolic.compile_symbolic``: an Ember ShapeEnv whose symbols stand
  for the graph's, sizes as sympy expressions through lowering and code generation, C++
  kernels taking the sizes as arguments). Where that path declines (a
  ``NotImplementedError`` anywhere in it: a target without size arguments, ``freezing``,
  code generation that needs a static size; a *lowering* that needs one declines only its
  op, which runs its ATen kernel inside the symbolic program), the reason is logged
  (``EMBER_LOGS=perf_hints``, counted in ``compile_stats.symbolic_declines``) and the
  graph is served by
  :class:`SizeSpecializer`: on each call it keys on the concrete ints and tensor sizes and
  strides and compiles the graph statically for that key (its SymInt placeholders become
  constants), keeping the ``SPECIALIZATIONS_KEPT`` most recently used, each compile logged
  with why it specialised. Any other exception of the symbolic path is a bug: raised when
  ``config.fallback_on_lowering_error`` is off (the tests), else warned about and served
  per size, as a lowering's bug runs the op's ATen kernel today.
* **Guards.** Tracing and lowering may decide on sizes (a decomposition's branch, a slice
  that must not be empty): each decision is a guard of the Ember ShapeEnv (a lowering may
  only exclude sizes, never pin one: ``symbolic.BackendShapeEnv``). The compiled program
  checks them on every call from the symbol ints (one generated lambda); a call that
  breaks one is served by the per-size path, logged.
"""
from __future__ import annotations

import collections
import contextlib
import operator
from typing import Callable

import torch
import torch.fx

from ember import config, logs
from ember.backend import compile_stats
from ember.backend.passes.specialize import item_inputs, specialize_graph

SPECIALIZATIONS_KEPT = 8     # per-size compiles kept per graph (least recently used dropped)


def is_symbolic(example_inputs: list) -> bool:
    """Some input is a SymInt, or a tensor with a symbolic size or stride."""
    for value in example_inputs:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(value, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride())):
            return True
    return False


def compile_dynamic(gm: torch.fx.GraphModule, example_inputs: list, options: dict) -> Callable:
    """``gm`` compiled for every size its symbolic example inputs stand for (see the module
    docstring)."""
    from ember.backend.compile import compile_shaped
    return compile_shaped(gm, lambda flat_gm: _compile_dynamic(flat_gm, example_inputs,
                                                               options))


def _compile_dynamic(gm: torch.fx.GraphModule, example_inputs: list, options: dict
                     ) -> Callable:
    from ember.backend.symbolic import compile_symbolic
    specializer = SizeSpecializer(gm, example_inputs, options)
    try:
        with _output_code_logged(options["debug"]):
            compiled = compile_symbolic(gm, example_inputs, options, specializer)
    except NotImplementedError as e:
        compile_stats.symbolic_declines[str(e)] += 1
        logs.log("perf_hints", "ember backend: symbolic compile declined (%s); compiling per "
                               "size", e)
        specializer.reason = f"the symbolic compile declined: {e}"
        return specializer
    except Exception as e:
        if not config.fallback_on_lowering_error:
            raise
        logs.warn("ember backend: symbolic compile failed (%s: %s, a bug); compiling per "
                  "size", type(e).__name__, e)
        specializer.reason = f"the symbolic compile failed: {type(e).__name__}"
        return specializer
    compile_stats.symbolic_compiles += 1
    return compiled


@contextlib.contextmanager
def _output_code_logged(debug: bool):
    """``debug=True``: the compile logs its code as under ``EMBER_LOGS=output_code`` (as
    ``compile_graph`` does for static graphs)."""
    if not debug or logs.enabled("output_code"):
        yield
        return
    was_on = [a for a in logs.ARTIFACTS if logs.enabled(a)]
    logs.set_logs(",".join([*was_on, "output_code"]))
    try:
        yield
    finally:
        logs.set_logs(",".join(was_on))


def _concrete(value):
    """An example input as a plain value: a SymInt's hint, a tensor as it is."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node.hint
    return value


class SizeSpecializer:
    """Serves a graph per concrete size: one static compile per key of ints, sizes and
    strides, ``SPECIALIZATIONS_KEPT`` kept, least recently used dropped."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, options: dict):
        self.gm = gm
        self.options = options
        self.kinds = ["size" if isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)
                      else "scalar" if isinstance(v, (float, bool, torch.SymFloat,
                                                      torch.SymBool))
                      else "tensor" for v in example_inputs]
        self.items = item_inputs(gm)
        for i in self.items:
            self.kinds[i] = "item"
        self.reason = "guard failed"
        self.entries: collections.OrderedDict = collections.OrderedDict()
        self.compiles = 0

    def key(self, args) -> tuple:
        return tuple(a if kind in ("size", "scalar") else a.item() if kind == "item" else
                     (tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor)
                     else a for a, kind in zip(args, self.kinds))

    def __call__(self, *args):
        key = self.key(args)
        fn = self.entries.get(key)
        if fn is None:
            fn = self.entries[key] = self.compile(args, key)
            if len(self.entries) > SPECIALIZATIONS_KEPT:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(key)
        return fn(*args)

    def compile(self, args, key) -> Callable:
        from ember.backend.compile import compile_graph
        self.compiles += 1
        compile_stats.size_specializations += 1
        logs.log("perf_hints", "ember backend: compiling the graph for sizes %s (%s)",
                 [k for k, kind in zip(key, self.kinds) if kind != "scalar"], self.reason)
        args = [_concrete(a) for a in args]
        keep = [i for i, kind in enumerate(self.kinds) if kind != "size"]
        gm = specialize_graph(self.gm, {i: args[i] for i, kind in enumerate(self.kinds)
                                        if kind == "size"},
                              {i: args[i].item() for i in self.items})
        compiled = compile_graph(gm, [args[i] for i in keep], **self.options)
        getter = operator.itemgetter(*keep) if len(keep) > 1 else None
        if getter is None:
            if not keep:
                return lambda *a: compiled()
            only = keep[0]
            return lambda *a: compiled(a[only])
        return lambda *a: compiled(*getter(a))
