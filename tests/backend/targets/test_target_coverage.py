"""Every registered target implements every op of the ops table (``ember/backend/ops.py``),
so an op a target lacks is a failure here, not a KeyError when a body first calls it; and
the two CPU targets answer the policy questions alike (a CPU graph lowers the same on
both, only its kernels' language differs)."""
import pytest
import torch

from ember.backend.ops import OP_NAMES
from ember.backend.targets import Target, registered_targets, target_for

TARGETS = registered_targets()


def missing_ops(target: type[Target]) -> list[str]:
    """The names of ``OP_NAMES`` that ``target``'s ops handler does not implement (the
    handlers resolve most names through ``__getattr__`` tables: asked of a bare instance,
    a name they lack raises AttributeError)."""
    handler_class = target.ops_handler()
    handler = handler_class.__new__(handler_class)
    missing = []
    for name in OP_NAMES:
        try:
            if not callable(getattr(handler, name)):
                missing.append(name)
        except AttributeError:
            missing.append(name)
    return missing


def test_the_built_in_targets_are_registered():
    assert {(device_type, name) for device_type, name, _ in TARGETS} >= {
        ("cpu", "cpp"), ("cpu", "triton"), ("cuda", "triton")}


@pytest.mark.parametrize("device_type,name,target", TARGETS,
                         ids=[f"{d}-{n}" for d, n, _ in TARGETS])
def test_target_implements_every_op(device_type, name, target):
    assert missing_ops(target) == [], f"{device_type}/{name} lacks these ops"


def test_a_missing_op_is_found():
    """A target whose handler lacks ``sin`` (and answers nothing else) is caught."""
    cpp_handler = target_for(torch.device("cpu"), "cpp").ops_handler()

    class NoSin(cpp_handler):
        def __getattr__(self, name):
            if name == "sin":
                raise AttributeError(name)
            return super().__getattr__(name)

    class Toy(Target):
        @classmethod
        def ops_handler(cls):
            return NoSin
    assert missing_ops(Toy) == ["sin"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16, torch.int64])
def test_cpu_targets_share_the_cpu_policy(dtype):
    cpp, triton = (target_for(torch.device("cpu"), backend) for backend in ("cpp", "triton"))
    for target in (cpp, triton):
        assert target.pads_matmuls(dtype) is False
        assert target.adds_addmm_bias(dtype) is (dtype in (torch.float32, torch.float64))
        assert not target.supports_cudagraphs and not target.keeps_depthwise_nchw
        assert target.cache_identity() is None


def test_unknown_cpu_backend_and_device():
    with pytest.raises(ValueError, match="cpu_backend must be 'cpp' or 'triton', not 'x'"):
        target_for(torch.device("cpu"), "x")
    with pytest.raises(NotImplementedError, match="no code generation target for device"):
        target_for(torch.device("meta"))
