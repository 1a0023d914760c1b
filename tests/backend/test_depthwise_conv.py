"""Depthwise convolutions lowered to fused loops (ember/backend/lowering/convolution.py):
results match eager's for strides, paddings, dilations, rectangular filters, with and
without bias, in both layouts; other convolutions keep their ATen kernel."""
import os

import pytest
import torch

import ember
from ember.backend import compile as backend_compile
from ember.testing import same

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
NEEDS_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                                 reason="needs a CUDA GPU")]
TARGETS = [("cpu", {}), pytest.param(("cpu", {"cpu_backend": "triton"}), marks=pytest.mark.skipif(
    not INTERPRETED, reason="Triton's interpreter is enabled only in processes started with "
                            "TRITON_INTERPRET=1 (tests/conftest.py, without a GPU)")),
           pytest.param(("cuda", {}), marks=NEEDS_GPU)]

CASES = [  # channels, kernel, stride, padding, dilation, bias
    (8, 3, 1, 1, 1, True), (8, 3, 2, 1, 1, False), (6, 5, 1, 2, 1, True),
    (4, 3, 1, 2, 2, True), (4, 3, 2, 0, 1, True), (5, (3, 1), (1, 2), (1, 0), 1, True)]


def _wrapper() -> str:
    return [s for s in backend_compile.generated_sources if "def call(" in s][-1]


@pytest.mark.parametrize("target", TARGETS, ids=["cpp", "triton-interp", "cuda"])
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_depthwise_conv_is_fused_and_matches_eager(target, case, channels_last):
    device, options = target
    channels, kernel, stride, padding, dilation, bias = case
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(channels, channels, kernel, stride, padding, dilation,
                           groups=channels, bias=bias).to(device)
    x = torch.randn(2, channels, 9, 10, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def fn(x):
        return torch.relu(conv(x) * 2)
    ember.reset()
    with torch.no_grad(), torch.backends.cudnn.flags(allow_tf32=False):
        out, expected = ember.compile(fn, options=options)(x), fn(x)
    assert same(expected, out, rtol=1e-5, atol=1e-5)
    assert out.stride() == expected.stride()
    assert "convolution" not in _wrapper()       # computed by a generated kernel


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
def test_depthwise_conv_in_bfloat16_sums_in_float32():
    """(The CPU targets compute no half precision: there the convolution runs ATen's.)"""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 16, 3, 1, 1, groups=16).to("cuda", torch.bfloat16)
    x = torch.randn(2, 16, 12, 12, dtype=torch.bfloat16, device="cuda")
    ember.reset()
    with torch.no_grad():
        out, expected = ember.compile(conv)(x), conv(x)
        reference = torch.nn.functional.conv2d(x.float(), conv.weight.float(),
                                               conv.bias.float(), padding=1, groups=16)
    # one rounding of a float32 sum: as close to the float32 result as eager's bf16 kernel
    assert (out.float() - reference).abs().max() <= \
        (expected.float() - reference).abs().max() + 1e-6
    assert "convolution" not in _wrapper()


@pytest.mark.parametrize("groups, out_channels", [(2, 8), (8, 16)],
                         ids=["grouped", "depth-multiplier-2"])
def test_other_grouped_convs_keep_their_aten_kernel(groups, out_channels):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, out_channels, 3, padding=1, groups=groups)
    x = torch.randn(2, 8, 7, 7)
    ember.reset()
    with torch.no_grad():
        out, expected = ember.compile(conv)(x), conv(x)
    assert same(expected, out, rtol=1e-5, atol=1e-5)
    assert "convolution" in _wrapper()
