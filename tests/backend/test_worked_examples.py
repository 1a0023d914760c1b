"""The README's worked examples ("Extending the backend"), followed step by step: a math op
added to the ops table with each target's code, lowered from a custom op, compiled on both
CPU targets; and a graph pass added to the pipeline's stages. Everything a test adds is
taken out again, so no other test sees it."""
import re

import pytest
import torch

import ember
from ember.backend import ops as ops_table
from ember.backend import compile_stats, pipeline
from ember.backend.lowering.registry import LOWERINGS, make_pointwise, register_lowering
from ember.backend.ops import ops
from ember.backend.targets import register_op, registered_targets, unregister_op
from ember.testing import run_and_get_code

# an op eager computes with its own kernel, which the toy lowering replaces
_lib = torch.library.Library("ember_worked_example", "DEF")
_lib.define("cube(Tensor x) -> Tensor")
_lib.impl("cube", lambda x: x * x * x, "CompositeExplicitAutograd")
cube = torch.ops.ember_worked_example.cube


@pytest.fixture
def toy_cube():
    """The README's steps: ``ops.toy_cube`` with each target's code, and its lowering."""
    try:
        register_op("toy_cube", 1, cpp="{0} * {0} * {0}", triton="{0} * {0} * {0}")

        @register_lowering(cube.default)
        def lower_cube(ctx, x):
            return make_pointwise(ctx, ops.toy_cube, [x])
        yield
    finally:
        LOWERINGS.pop(cube.default, None)
        if "toy_cube" in ops_table.OP_NAMES:
            unregister_op("toy_cube")
        ember.reset()


def test_an_added_op_compiles_on_both_cpu_targets(cpu_backend, toy_cube):
    for _, name, target in registered_targets():      # what test_target_coverage checks
        handler = target.ops_handler()
        assert callable(getattr(handler.__new__(handler), "toy_cube")), name

    def f(x):
        return cube(x.sin()).sum(-1) + cube(x[:, 0])

    x = torch.randn(6, 33)
    ember.reset()
    result, sources = run_and_get_code(f, x)
    torch.testing.assert_close(result, f(x))
    assert not compile_stats.fallback_ops, compile_stats.fallback_ops
    kernels = "\n".join(sources[1:])     # the wrapper first, then the kernels
    assert re.search(r"(tmp\d+) \* \1 \* \1", kernels), kernels
    assert "ember_worked_example" not in sources[0]    # the wrapper calls no ATen cube


def test_the_added_op_is_gone_afterwards():
    """Runs after the test above (file order): its fixture took everything out."""
    assert "toy_cube" not in ops_table.OP_NAMES and "toy_cube" not in ops_table.UNARY
    assert cube.default not in LOWERINGS
    for _, _, target in registered_targets():
        assert "toy_cube" not in target.op_templates(1)


def test_register_op_wants_code_for_every_target():
    with pytest.raises(ValueError, match=r"needs code for each target \(cpp, triton\); "
                                         r"given: cpp"):
        register_op("toy_square", 1, cpp="{0} * {0}")
    with pytest.raises(ValueError, match="ops.sin already exists"):
        register_op("sin", 1, cpp="{0}", triton="{0}")
    with pytest.raises(ValueError, match="arity must be 1 or 2"):
        register_op("toy_fma", 3, cpp="{0}", triton="{0}")
    with pytest.raises(ValueError, match="ops.sin was not added by register_op"):
        unregister_op("sin")
    assert "toy_square" not in ops_table.OP_NAMES
    assert all("toy_square" not in t.op_templates(1) for _, _, t in registered_targets())


# -- a graph pass (the README's example, inserted into pipeline.CODEGEN_STAGES) -----------

aten = torch.ops.aten


def squares_as_products(gm: torch.fx.GraphModule) -> None:
    """x ** 2 as x * x in an ATen graph."""
    for node in gm.graph.find_nodes(op="call_function", target=aten.pow.Tensor_Scalar):
        if node.args[1] == 2:
            with gm.graph.inserting_before(node):
                product = gm.graph.call_function(aten.mul.Tensor, (node.args[0],) * 2)
            product.meta = dict(node.meta)
            node.replace_all_uses_with(product)
            gm.graph.erase_node(node)
    gm.recompile()


def test_an_added_pass_runs_before_lowering(monkeypatch):
    seen = []

    def squares(g: pipeline.Generation) -> None:
        powers = lambda: [n.args[1] for n in g.gm.graph.find_nodes(   # noqa: E731
            op="call_function", target=aten.pow.Tensor_Scalar)]
        before = powers()
        squares_as_products(g.gm)
        seen.append((before, powers()))
    stages = list(pipeline.CODEGEN_STAGES)
    stages.insert([s.name for s in stages].index("lowering"),
                  pipeline.Stage("squares", squares, timed="lowering"))
    monkeypatch.setattr(pipeline, "CODEGEN_STAGES", stages)

    def f(x):
        return (x ** 2).sum(0) - x.pow(3)[0]

    x = torch.randn(5, 7)
    ember.reset()
    try:
        result, _ = run_and_get_code(f, x)
    finally:
        ember.reset()
    torch.testing.assert_close(result, f(x))
    assert seen == [([2, 3], [3])]     # x ** 2 rewritten, x ** 3 left
