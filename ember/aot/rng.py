"""Random ops the backward draws again: the forward saves the generator's state, not the draw.

A dropout's backward multiplies by the forward's mask. Saving the mask costs a byte per
element, held from the forward to the backward; the generator's state before the draw costs
16 bytes on CUDA (seed and offset) and 5 KiB on the CPU (Mersenne Twister), and replaying the
draw from it gives the same bits, because it runs eager's own kernel on the same geometry.

``replay_random_ops(joint)`` rewrites the joint graph before the partitioner cuts it. Each
random op ``R`` of the forward (``nondeterministic_seeded``, eager's generator) whose outputs
some node that only the backward needs reads becomes

* ``RecordRandom(R)(*args) -> (*outputs, state)``: the op as eager runs it, and the state of
  its device's generator from just before it (one node, so no scheduling can put another draw
  in between); the forward's own readers read its outputs;
* ``ReplayRandom(R)(state, *args) -> (*outputs,)``: sets the state, runs the op, puts the
  generator back (eager's backward draws nothing, so neither does this); the backward-only
  readers read its outputs instead. An argument of which only the geometry matters
  (dropout's input, ``rand_like``'s template) is a blank tensor of that geometry, so the
  backward does not need its values.

``ReplayRandom`` is cheap to recompute (``partition.recomputable``), so the minimum cut picks
between saving its outputs and saving the state. When it saves an output, the forward hands
over the record's same output (``twin``): the forward never draws twice. Every draw of the
forward stays in the forward graph even if nothing reads it (``draws``), so the generator
advances as in eager.

Both ``fallback_random`` settings: an op the backward replays runs eager's kernel in the
forward too (a fused Philox draw could not be replayed by eager's kernel).
"""
from __future__ import annotations

import operator

import torch
import torch.fx

__all__ = ["RecordRandom", "ReplayRandom", "draws", "eager_generator", "replay_random_ops",
           "twin"]

aten = torch.ops.aten

# ops whose draw depends on one argument's geometry (size, strides, dtype), not its values:
# op -> (that argument's position, the outputs that depend on nothing else). Dropout's
# output scales its input's values: only its mask is replayed from a blank input.
_GEOMETRY_ONLY = {aten.native_dropout.default: (0, (1,)), aten.bernoulli.p: (0, (0,)),
                  aten.rand_like.default: (0, (0,)), aten.randn_like.default: (0, (0,)),
                  aten.randint_like.default: (0, (0,)), aten.randint_like.low_dtype: (0, (0,))}


def eager_generator(device: torch.device) -> torch.Generator:
    """The generator eager's random ops on ``device`` draw from: the CPU's, or the default
    generator of the device's index in its torch module (``torch.cuda``...)."""
    if device.type == "cpu":
        return torch.default_generator
    try:
        module = torch.get_device_module(device)
    except RuntimeError:      # a device type torch has no module for (meta)
        module = None
    generators = getattr(module, "default_generators", None)
    if generators is None:
        raise NotImplementedError(f"no default generator for {device.type}")
    return generators[device.index if device.index is not None else module.current_device()]


class RecordRandom:
    """``op(*args, **kwargs)`` and the state its device's generator had before the draw."""

    def __init__(self, op: torch._ops.OpOverload, device: torch.device):
        self.op, self.device = op, device
        self.__name__ = f"record_rng_{op.__name__.replace('.', '_')}"

    def __call__(self, *args, **kwargs):
        state = eager_generator(self.device).get_state()
        out = self.op(*args, **kwargs)
        return (*out, state) if isinstance(out, (tuple, list)) else (out, state)

    def __repr__(self):
        return self.__name__


class ReplayRandom:
    """The same draw again from a saved state; the generator is left as it was found.

    ``blank``: the position of an argument of which only the geometry matters, with the
    ``(size, stride, storage_offset, dtype)`` to make an uninitialised one of (the storage
    offset kept: eager's CUDA dropout picks its vector width from the data's alignment)."""

    def __init__(self, op: torch._ops.OpOverload, device: torch.device,
                 blank: tuple[int, tuple] | None):
        self.op, self.device, self.blank = op, device, blank
        self.__name__ = f"replay_rng_{op.__name__.replace('.', '_')}"

    def __call__(self, state, *args, **kwargs):
        if self.blank is not None:
            at, (size, stride, offset, dtype) = self.blank
            extent = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1 \
                if all(size) else offset
            storage = torch.empty(extent, dtype=dtype, device=self.device)
            args = list(args)
            args[at] = storage.as_strided(size, stride, offset)
        generator = eager_generator(self.device)
        before = generator.get_state()
        generator.set_state(state)
        try:
            out = self.op(*args, **kwargs)
        finally:
            generator.set_state(before)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def __repr__(self):
        return self.__name__


def twin(node: torch.fx.Node) -> torch.fx.Node:
    """The record's output a replay's output equals (the node itself for any other)."""
    return node.meta.get("ember_replay_twin", node)


def _dropout_p(node: torch.fx.Node):
    """The ``dropout_p`` argument of an attention op's call (None: the op has none)."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == "dropout_p":
            return node.args[i] if i < len(node.args) else \
                node.kwargs.get("dropout_p", arg.default_value)
    return None


def _replayable(node: torch.fx.Node) -> bool:
    """A random op whose draw the backward may make again. Not attention: its backward
    kernel derives the dropout mask from the seed and offset the forward returns, and
    replaying it would run the whole forward attention again in the backward."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags or target._schema.is_mutable:
        return False
    if _dropout_p(node) is not None:
        return False
    if node.kwargs.get("generator") is not None:       # a user's generator: not replayed
        return False
    vals = node.meta.get("val")
    vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
    return bool(vals) and all(isinstance(v, torch.Tensor) for v in vals) and \
        vals[0].device.type in ("cpu", "cuda")


def draws(node: torch.fx.Node) -> bool:
    """The node advances a generator (a seeded random op, or its record)."""
    target = node.target
    if node.op != "call_function":
        return False
    if isinstance(target, RecordRandom):
        return True
    # attention with no dropout takes nothing from the generator
    return isinstance(target, torch._ops.OpOverload) and \
        torch.Tag.nondeterministic_seeded in target.tags and _dropout_p(node) not in (0, 0.0)


def _outputs(node: torch.fx.Node) -> list[list[torch.fx.Node]] | None:
    """Per output of ``node``, the nodes that read it (``getitem`` nodes for a tuple); None
    when a tuple is read whole."""
    if isinstance(node.meta["val"], (tuple, list)):
        out = [[] for _ in node.meta["val"]]
        for user in node.users:
            if user.target is not operator.getitem:
                return None
            out[user.args[1]].append(user)
        return out
    return [[node]]


def replay_random_ops(gm: torch.fx.GraphModule, backward: set, needed: set) -> int:
    """Rewrite the joint graph ``gm`` as the module docstring says (``backward``: the nodes
    that depend on a tangent; ``needed``: those the forward's outputs and effects need);
    returns how many random ops the backward may now replay."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node in backward or not _replayable(node):
            continue
        per_output = _outputs(node)
        if per_output is None:
            continue
        blank, replayed = None, range(len(per_output))
        at, value_free = _GEOMETRY_ONLY.get(node.target, (None, ()))
        if at is not None and at < len(node.args) and isinstance(node.args[at], torch.fx.Node):
            t = node.args[at].meta["val"]
            blank = (at, (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype))
            replayed = value_free
        later = [[u for r in readers for u in r.users if u not in needed and u.op != "output"]
                 if k in replayed else [] for k, readers in enumerate(per_output)]
        if not any(later):
            continue
        vals = node.meta["val"]
        single = not isinstance(vals, (tuple, list))
        vals = [vals] if single else list(vals)
        device = vals[0].device
        state = eager_generator(device).get_state()
        with graph.inserting_before(node):
            record = graph.call_function(RecordRandom(node.target, device), node.args,
                                         dict(node.kwargs))
            record.meta["val"] = (*vals, state)
            state_node = graph.call_function(operator.getitem, (record, len(vals)))
            state_node.meta["val"] = state
            replay_args = list(node.args)
            if blank is not None:
                replay_args[blank[0]] = None
            replay = graph.call_function(ReplayRandom(node.target, device, blank),
                                         (state_node, *replay_args), dict(node.kwargs))
            replay.meta["val"] = tuple(vals)
            redone = {}
            for k in replayed:
                redone[k] = graph.call_function(operator.getitem, (replay, k))
                redone[k].meta["val"] = vals[k]
        if single:
            with graph.inserting_after(state_node):
                first = graph.call_function(operator.getitem, (record, 0))
            first.meta["val"] = vals[0]
            node.replace_all_uses_with(first)
            per_output = [[first]]
        else:
            for readers in per_output:
                for r in readers:
                    r.args = (record, r.args[1])
        for k in replayed:
            readers = per_output[k]
            if readers:
                redone[k].meta["ember_replay_twin"] = readers[0]
            for reader in readers:
                for user in list(reader.users):
                    if user in later[k]:
                        user.replace_input_with(reader, redone[k])
        graph.erase_node(node)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count
