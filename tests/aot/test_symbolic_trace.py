"""ATen tracing and the joint graph on symbolic fakes (a ShapeEnv's SymInts as inputs): the
backend's symbolic compiles (ember/backend/symbolic.py) trace this way."""
import torch

from ember.aot import trace_to_aten
from ember.aot.joint import trace_joint
from ember.fake import FakeTensorMode
from ember.shapes import ShapeEnv


def _symbolic_inputs():
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    x = mode.from_real(torch.randn(6, 3), dynamic_dims={0}, source="x")
    return env, mode, [x.shape[0], x]


def test_sizes_stay_symbolic_in_the_aten_graph():
    def fn(s, x):
        return (x[: s // 2] * 2).sum(0), x.view(s * 3)

    env, mode, inputs = _symbolic_inputs()
    gm = torch.fx.symbolic_trace(fn)
    aten_graph = trace_to_aten(gm, inputs, fake_mode=mode)
    placeholders = [n for n in aten_graph.gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(placeholders[0].meta["val"], torch.SymInt)
    sliced = next(n for n in aten_graph.gm.graph.nodes
                  if n.target is torch.ops.aten.slice.Tensor)
    assert str(sliced.meta["val"].shape[0]) == "FloorDiv(s0, 2)"    # an expression, not 3
    viewed = next(n for n in aten_graph.gm.graph.nodes
                  if n.target is torch.ops.aten.view.default)
    assert str(viewed.args[1][0]) == "3*s0"
    assert "x.size(0) ==" not in env.guards_as_python()         # the size not pinned


def test_joint_graph_of_symbolic_inputs():
    def fn(s, x, w):
        return ((x * w).sum(1) * s,)

    env, mode, (s, x) = _symbolic_inputs()
    w = mode.from_real(torch.randn(3, requires_grad=True))
    joint = trace_joint(torch.fx.symbolic_trace(fn), [s, x, w], fake_mode=mode)
    assert joint.grad_inputs == [2]                              # w; not the size
    grad = list(joint.gm.graph.output_node().args[0])[-1]
    assert tuple(grad.meta["val"].shape) == (3,)
    tangent = joint.tangent_nodes[0].meta["val"]
    assert str(tangent.shape[0]) == "s0"
