"""Library (ATen) results whose layout differs from the traced one are given the layout the
generated kernels index them with, instead of failing the call
(ember/backend/runtime/__init__.py)."""
import torch
import torch.nn.functional as F

import ember
from ember.backend.runtime import with_layout
from ember.testing import same


def test_attention_result_in_another_layout_is_relaid(cpu_backend, ember_log):
    """The CPU flash kernel lays its output out like the query it is given. Ember stores
    the query (a pointwise result) contiguous where eager keeps the transposed strides, so
    the output's layout differs from the traced one (LlamaForCausalLM failed on this)."""
    seq, dim = 16, 8

    def attend(x, k, v):
        q = x.view(1, seq, 9, dim).transpose(1, 2) * 2
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(1, seq, -1) + 1

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, seq, 9 * dim, generator=g)
    k, v = [torch.randn(1, seq, 3, dim, generator=g).transpose(1, 2) for _ in range(2)]
    ember.logs.set_logs("perf_hints")
    with torch.no_grad():
        compiled = ember.compile(attend)
        for _ in range(2):
            assert same(attend(x, k, v), compiled(x, k, v), rtol=1e-5, atol=1e-5)
    if cpu_backend == "cpp":     # (the Triton target happens to store the query as eager does)
        assert "copied on every call" in ember_log.text     # the mismatch did happen


def test_with_layout_copies_only_on_a_mismatch():
    t = torch.randn(2, 3, 4)
    assert with_layout(t, (2, 3, 4), (12, 4, 1)) is t
    narrow = t[:, :1]
    assert with_layout(narrow, (2, 1, 4), (12, 99, 1)) is narrow    # size-1 dims: any stride
    other = with_layout(t, (2, 3, 4), (1, 2, 6))
    assert other.stride() == (1, 2, 6) and torch.equal(other, t)


def test_wrapper_calls_no_python_function_on_its_common_path():
    """Views and layout checks of ATen results are C calls in the wrapper's own frame: a
    Python callee may start a fresh frame-stack chunk, mapped and unmapped on every call."""
    from ember.backend import compile as backend_compile

    def fn(x, w, y):
        h = torch.mm(x, w)
        return (h.view(2, 4, 8) + y).relu(), torch.mm(h.t(), x)

    x, w, y = torch.randn(8, 8), torch.randn(8, 8), torch.randn(4, 8)
    backend_compile.generated_sources.clear()
    with torch.no_grad():
        assert same(fn(x, w, y), ember.compile(fn)(x, w, y), rtol=1e-5, atol=1e-5)
    wrapper = next(s for s in backend_compile.generated_sources if "def call(" in s)
    body = wrapper[wrapper.index("def call("):].splitlines()[1:]
    assert "reinterpret(" not in wrapper
    layouts = [line.strip() for line in body if "with_layout(" in line]
    assert layouts and all(line.startswith("if ") for line in layouts), layouts


def test_result_of_another_dtype_than_its_meta_kernel_says_is_converted(ember_log):
    """torch's meta kernel for ``_batch_norm_with_update_functional`` gave half running
    statistics float32; a Triton kernel then read float16 memory as float32 (CUDA OpInfo:
    every running mean wrong). The wrapper checks the dtype with the layout."""
    got = with_layout(torch.tensor([1.5, 2.0], dtype=torch.float16), (2,), (1,),
                      torch.float32)
    assert got.dtype == torch.float32 and got.tolist() == [1.5, 2.0]
    assert "returned torch.float16 where its meta kernel says torch.float32" in ember_log.text


def test_half_batch_norm_running_statistics_keep_their_dtype():
    from ember.fake import FakeTensorMode
    args = [torch.randn(3, 5, 4), torch.randn(5), torch.randn(5), torch.randn(5),
            torch.rand(5) + 0.5]
    args = [a.half() for a in args]
    op = torch.ops.aten._batch_norm_with_update_functional.default
    mode = FakeTensorMode()
    fakes = [mode.from_real(a) for a in args]
    with mode:
        fake = op(*fakes, 0.5, 0.6)
    assert [f.dtype for f in fake[4:]] == [t.dtype for t in op(*args, 0.5, 0.6)[4:]]
