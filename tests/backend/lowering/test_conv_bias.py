"""A convolution whose result only generated code reads runs without its bias, the bias added
in the kernel after it, where the target says the library adds it in a pass of its own
(``Target.adds_conv_bias``: CUDA). The CPU targets answer no (oneDNN adds it inside); here they
are made to answer yes, so the lowering runs under both CPU code generators and its results are
compared with eager's. A convolution returned, read twice or read by a library call keeps its
bias."""
import pytest
import torch
import torch.nn.functional as F

from ember import config
from ember.backend.targets import CpuPolicy, target_for
from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("cpu_backend", "fresh_no_grad")


@pytest.fixture
def adds_bias(monkeypatch):
    monkeypatch.setattr(CpuPolicy, "adds_conv_bias", lambda self, dtype: True)


def _convolution_calls(fn, *args):
    out, sources = run_and_get_code(fn, *args)
    torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)
    wrapper = "\n".join(sources)
    # the wrapper's library calls, each commented with its op (kernel names say
    # "convolution" too, where a kernel adds a convolution's bias)
    return [line.strip() for line in wrapper.splitlines() if "# aten.convolution" in line
            and "(" in line and not line.strip().startswith("#")]


def _bn_relu(y, m, v):
    return F.batch_norm(y, m, v, training=False).relu()


def _params(cin=3, cout=8, dims=2):
    x = torch.randn((2, cin) + (9,) * dims)
    w = torch.randn((cout, cin) + (3,) * dims) / 5
    return x, w, torch.randn(cout), torch.randn(cout), torch.rand(cout) + 0.5


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_bias_moves_into_the_batch_norm_kernel(adds_bias, dims):
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
    x, w, b, m, v = _params(dims=dims)
    calls = _convolution_calls(lambda x, w, b, m, v: _bn_relu(conv(x, w, b, padding=1), m, v),
                               x, w, b, m, v)
    assert calls and all("None" in c for c in calls), calls


def test_transposed_convolution_and_a_bias_of_another_dtype(adds_bias):
    x, w, b = torch.randn(2, 4, 5, 5), torch.randn(4, 6, 3, 3), torch.randn(6)
    calls = _convolution_calls(
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2).sigmoid(), x, w, b)
    assert calls and all("None" in c for c in calls), calls
    # float64 input and weight, the bias float64 too, added in the sigmoid's kernel
    calls = _convolution_calls(lambda x, w, b: F.conv2d(x, w, b).tanh(),
                               torch.randn(1, 6, 6, 6, dtype=torch.float64),
                               torch.randn(4, 6, 3, 3, dtype=torch.float64),
                               torch.randn(4, dtype=torch.float64))
    assert calls and all("None" in c for c in calls), calls


@pytest.mark.parametrize("case", ["returned", "read twice", "library reader", "cpu policy"])
def test_bias_stays_where_it_would_cost_a_pass(monkeypatch, case):
    if case != "cpu policy":
        monkeypatch.setattr(CpuPolicy, "adds_conv_bias", lambda self, dtype: True)
    # (a channels-last graph copies a returned result back to eager's layout: generated code
    # that reads it, which the bias may join)
    monkeypatch.setattr(config, "layout_optimization", "off")
    x, w, b, m, v = _params()
    if case == "returned":
        def fn(x, w, b, m, v):
            return F.conv2d(x.relu(), w, b)
    elif case == "read twice":
        def fn(x, w, b, m, v):
            y = F.conv2d(x, w, b)
            return y.relu(), y.sigmoid()
    elif case == "library reader":
        def fn(x, w, b, m, v):
            return F.conv2d(F.conv2d(x, w, b, padding=1), w.transpose(0, 1)[:3, :].contiguous()
                            .transpose(0, 1).reshape(3, 8, 3, 3)[:, :8], None)
    else:
        def fn(x, w, b, m, v):
            return _bn_relu(F.conv2d(x, w, b), m, v)
    calls = _convolution_calls(fn, x, w, b, m, v)
    assert calls and "None" not in calls[0], calls


def test_the_targets_answers():
    cpu = [target_for(torch.device("cpu"), name) for name in ("cpp", "triton")]
    assert not any(t.adds_conv_bias(torch.bfloat16) for t in cpu)
    from ember.backend.targets.triton.target import TritonTarget
    cuda = TritonTarget.__new__(TritonTarget)     # its answer needs no GPU
    assert cuda.adds_conv_bias(torch.bfloat16) and cuda.adds_conv_bias(torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or
                    __import__("os").environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_convolution_bias_joins_the_batch_norm(dtype):
    # vgg16_bn's block at a small size: the bias is added in the batch norm's kernel
    x, w, b, m, v = (t.to("cuda", dtype) for t in _params(cin=16, cout=32))
    out, sources = run_and_get_code(lambda *a: _bn_relu(F.conv2d(a[0], a[1], a[2], padding=1),
                                                        *a[3:]), x, w, b, m, v)
    expected = _bn_relu(F.conv2d(x.float(), w.float(), b.float(), padding=1), m.float(),
                        v.float())
    error = ((out.float() - expected).norm() / expected.norm()).item()
    eager_error = ((_bn_relu(F.conv2d(x, w, b, padding=1), m, v).float() - expected).norm()
                   / expected.norm()).item()
    assert error <= 2 * eager_error + 1e-6, (error, eager_error)
    calls = [line for line in "\n".join(sources).splitlines()
             if "aten.convolution.default" in line and "=" in line]
    assert calls and all("None" in c for c in calls), calls
