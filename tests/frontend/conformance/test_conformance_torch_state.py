"""torch's process-wide state read inside compiled code: answered at capture as constants
guarded for the entry's life (a change recompiles), or, for methods of the objects that hold
it, a graph break with the method's name. Never a whole frame run eagerly."""
import pytest
import torch
import torch.distributed as dist

import ember
from conformance_util import _seed_rng, check  # noqa: F401
from ember.testing import CompileCounter


def ts_privateuse1_name(x):
    return x + len(torch._C._get_privateuse1_backend_name())


def ts_functorch_active(x):
    return x if torch._C._are_functorch_transforms_active() else x + 1


def ts_distributed_initialized(x):
    if dist.is_available() and dist.is_initialized():
        return x * dist.get_world_size()
    return x + 1


def ts_group_member_world(x):
    return x + 1 if dist.GroupMember.WORLD is None else x


def ts_backend_flags(x):
    if torch.backends.cudnn.enabled and not torch.backends.cuda.matmul.allow_tf32:
        x = x + 1
    if torch.backends.cudnn.deterministic or torch.backends.mkldnn.is_available():
        x = x * 2
    return x


def ts_onnx_export(x):
    return x if torch.onnx.is_in_onnx_export() else x - 1


def ts_autograd_engine_held(x):
    engine = torch.autograd.Variable._execution_engine
    return x * 2 if engine is not None else x


@pytest.mark.parametrize("fn", [ts_privateuse1_name, ts_functorch_active,
                                ts_distributed_initialized, ts_group_member_world,
                                ts_backend_flags, ts_onnx_export, ts_autograd_engine_held],
                         ids=lambda f: f.__name__)
def test_state_queries_in_one_graph(fn):
    check(fn, (torch.randn(3),))


def test_switched_flag_recompiles():
    cnt = CompileCounter()
    compiled = ember.compile(ts_backend_flags, backend=cnt)
    x = torch.randn(3)
    for enabled in (True, False, True):
        # flags() works even after torch's test utilities froze the global flags
        with torch.backends.cudnn.flags(enabled=enabled):
            assert torch.equal(compiled(x), ts_backend_flags(x))
    assert cnt.frame_count == 2


def ts_engine_method(x):
    y = x * 2
    torch.autograd.Variable._execution_engine.is_checkpoint_valid()
    return y + 1


def test_method_of_state_object_breaks_with_its_name():
    check(ts_engine_method, (torch.randn(3),), graphs=2)
    ember.reset()
    explained = ember.explain(ts_engine_method)(torch.randn(3))
    assert len(explained.break_reasons) == 1
    reason = explained.break_reasons[0]
    assert not reason.frame_ran_eagerly and "is_checkpoint_valid" in reason.reason


def test_handlers_of_submodules_not_imported_yet_register_when_they_are():
    """The frontend does not import torch.onnx itself (a tenth of a second of every first
    compile) to find ``is_in_onnx_export``; the handler registers once user code has
    imported it, so the query still compiles into one graph."""
    import subprocess
    import sys
    code = ("import sys, torch, ember.frontend.convert\n"
            "assert 'torch.onnx' not in sys.modules, 'the frontend imported torch.onnx'\n"
            "from ember.testing import CompileCounter\n"
            "import ember\n"
            "def f(x):\n"
            "    return x if torch.onnx.is_in_onnx_export() else x - 1\n"
            "cnt = CompileCounter()\n"
            "assert torch.equal(ember.compile(f, backend=cnt)(torch.ones(2)), torch.zeros(2))\n"
            "assert cnt.frame_count == 1, cnt.frame_count\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
