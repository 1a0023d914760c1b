"""ember.fake: fake tensors answer every metadata question exactly as eager does."""
import gc

import pytest
import torch
import torch.nn.functional as F

from ember.fake import DataDependentError, FakeTensor, FakeTensorMode, FakeUnsupported, is_fake


def _leaves(x):
    if isinstance(x, (tuple, list)):
        for y in x:
            yield from _leaves(y)
    else:
        yield x


def _assert_same_meta(real, fake, what=""):
    reals, fakes = list(_leaves(real)), list(_leaves(fake))
    assert len(reals) == len(fakes), what
    for r, f in zip(reals, fakes):
        if not isinstance(r, torch.Tensor):
            assert r == f, what
            continue
        assert is_fake(f), (what, type(f))
        assert f.shape == r.shape, (what, f.shape, r.shape)
        assert f.dtype == r.dtype, (what, f.dtype, r.dtype)
        assert f.stride() == r.stride(), (what, f.stride(), r.stride())
        assert f.storage_offset() == r.storage_offset(), what
        assert f.device == r.device, what
        assert f.requires_grad == r.requires_grad, (what, f.requires_grad, r.requires_grad)
        assert (f.grad_fn is None) == (r.grad_fn is None), what
        assert f._meta.shape == f.shape and f._meta.stride() == f.stride()


def _check(fn, *inputs, what=""):
    """Run fn eagerly on real inputs and under FakeTensorMode on their fakes; compare."""
    torch.manual_seed(0)
    real = fn(*inputs)
    mode = FakeTensorMode()
    fakes = [mode.from_real(t) if isinstance(t, torch.Tensor) else t for t in inputs]
    with mode:
        fake = fn(*fakes)
    _assert_same_meta(real, fake, what or getattr(fn, "__name__", ""))
    return fake


def _r(*shape, grad=False, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


FUNCTIONAL = {
    "linear": (lambda x, w, b: F.linear(x, w, b), (_r(4, 5), _r(3, 5, grad=True), _r(3, grad=True))),
    "conv2d": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), (_r(2, 3, 9, 9), _r(8, 3, 3, 3, grad=True))),
    "conv2d_cl": (lambda x, w: F.conv2d(x.to(memory_format=torch.channels_last), w, padding=1),
                  (_r(2, 3, 8, 8), _r(4, 3, 3, 3))),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), (_r(2, 4, 6), _r(6, grad=True), _r(6, grad=True))),
    "softmax": (lambda x: F.softmax(x, dim=-1), (_r(3, 7, grad=True),)),
    "log_softmax_half": (lambda x: F.log_softmax(x, dim=0, dtype=torch.float64), (_r(3, 7),)),
    "gelu": (lambda x: F.gelu(x, approximate="tanh"), (_r(5, 2, grad=True),)),
    "relu_silu": (lambda x: F.silu(F.relu(x)), (_r(5, 2),)),
    "dropout_train": (lambda x: F.dropout(x, 0.3, training=True), (_r(4, 4, grad=True),)),
    "dropout_eval": (lambda x: F.dropout(x, 0.3, training=False), (_r(4, 4),)),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             (_r(2, 4, 6, 8, grad=True), _r(2, 4, 6, 8), _r(2, 4, 6, 8))),
    "embedding": (lambda i, w: F.embedding(i, w), (torch.tensor([[0, 2], [1, 3]]), _r(5, 7, grad=True))),
    "batch_norm_train": (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=True),
                         (_r(4, 3, 5, 5), torch.zeros(3), torch.ones(3), _r(3, grad=True), _r(3, grad=True))),
    "batch_norm_eval": (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
                        (_r(4, 3, 5, 5), torch.zeros(3), torch.ones(3), _r(3), _r(3))),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1), (_r(2, 3, 10, 10, grad=True),)),
    "max_pool2d_idx": (lambda x: F.max_pool2d(x, 2, return_indices=True), (_r(2, 3, 8, 8),)),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (1, 1)), (_r(2, 3, 7, 7),)),
    "interpolate_nearest": (lambda x: F.interpolate(x, scale_factor=2), (_r(1, 2, 4, 4),)),
    "interpolate_bilinear": (lambda x: F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=False),
                             (_r(1, 2, 4, 4, grad=True),)),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), (_r(6, 4, grad=True), torch.tensor([0, 1, 2, 3, 0, 1]))),
    "cross_entropy_none": (lambda x, t: F.cross_entropy(x, t, reduction="none"), (_r(6, 4), torch.tensor([0, 1, 2, 3, 0, 1]))),
    "mse_loss": (lambda x, y: F.mse_loss(x, y), (_r(3, 3, grad=True), _r(3, 3))),
    # CPU roll keeps a channels-last input's layout (its Python meta kernel said contiguous)
    "roll_channels_last": (lambda x: (x.roll(2, 2), x.roll((1, 2), (1, 3)), x.roll(3)),
                           (_r(2, 3, 4, 5).to(memory_format=torch.channels_last),)),
    "roll_permuted": (lambda x: x.permute(0, 2, 3, 1).roll(1, 0), (_r(2, 3, 4, 5),)),
    "batch_norm_update_half": (
        lambda x, w, b, m, v: torch.ops.aten._batch_norm_with_update_functional(
            x, w, b, m, v, 0.5, 0.6)[4:],
        tuple(t.half() for t in (_r(3, 5, 4), _r(5), _r(5), _r(5), torch.rand(5) + 0.5))),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_functional_matches_eager(name):
    fn, inputs = FUNCTIONAL[name]
    _check(fn, *inputs, what=name)


def _setitem(x, v):
    x = x.clone()
    x[1:, 0] = v
    x[0] = 3.0
    return x


TENSOR_METHODS = {
    "view": (lambda x: x.view(3, 8), (_r(4, 6, grad=True),)),
    "view_neg": (lambda x: x.view(-1), (_r(4, 6),)),
    "reshape_noncontig": (lambda x: x.t().reshape(24), (_r(4, 6, grad=True),)),
    "permute": (lambda x: x.permute(2, 0, 1), (_r(2, 3, 4),)),
    "transpose_contiguous": (lambda x: x.transpose(0, 1).contiguous(), (_r(2, 3, 4),)),
    "expand": (lambda x: x.expand(5, 3, 4), (_r(3, 1),)),
    "index_ints_slices": (lambda x: x[1, ::2, None, ..., 1:3], (_r(3, 6, 5, 4),)),
    "index_neg_step_slice": (lambda x: x[..., -2:], (_r(3, 6),)),
    "index_tensor": (lambda x, i: x[i], (_r(5, 3, grad=True), torch.tensor([0, 4, 2]))),
    "index_tensor_2d": (lambda x, i: x[:, i], (_r(5, 3), torch.tensor([[0, 2], [1, 1]]))),
    "setitem": (_setitem, (_r(4, 3), _r(3))),
    "chunk": (lambda x: x.chunk(3, dim=1), (_r(2, 7, grad=True),)),
    "split": (lambda x: x.split([2, 5], dim=1), (_r(2, 7),)),
    "split_int": (lambda x: torch.split(x, 3), (_r(8, 2),)),
    "unbind": (lambda x: x.unbind(1), (_r(2, 3),)),
    "cat": (lambda a, b: torch.cat([a, b], dim=1), (_r(2, 3, grad=True), _r(2, 5))),
    "stack": (lambda a, b: torch.stack([a, b], dim=-1), (_r(2, 3), _r(2, 3))),
    "matmul_batched": (lambda a, b: torch.matmul(a, b), (_r(5, 2, 3, grad=True), _r(3, 4))),
    "matmul_at": (lambda a, b: a @ b, (_r(3), _r(2, 3, 4))),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), (_r(2, 3, 4), _r(2, 4, 5, grad=True))),
    "masked_fill": (lambda x, m: x.masked_fill(m, 0.0), (_r(3, 4), torch.rand(3, 4) > 0.5)),
    "where": (lambda c, a, b: torch.where(c, a, b), (torch.rand(3, 1) > 0.5, _r(1, 4), _r(3, 4, dtype=torch.float64))),
    "clone": (lambda x: x.clone(), (_r(3, 4).t(),)),
    "clone_contig": (lambda x: x.clone(memory_format=torch.contiguous_format), (_r(3, 4).t(),)),
    "to_dtype": (lambda x: x.to(torch.float16), (_r(3, 4, grad=True),)),
    "float": (lambda x: x.float(), (torch.arange(6).view(2, 3),)),
    "type_as": (lambda x, y: x.type_as(y), (_r(3), _r(2, dtype=torch.float64))),
    "new_zeros_ones": (lambda x: (x.new_zeros(2, 5), x.new_ones((3,))), (_r(3, dtype=torch.float64),)),
    "zeros_like": (lambda x: torch.zeros_like(x), (_r(3, 4).t(),)),
    "empty_like_contig": (lambda x: torch.empty_like(x, memory_format=torch.contiguous_format), (_r(3, 4).t(),)),
    "factories": (lambda: (torch.arange(10), torch.arange(0, 1, 0.25), torch.ones(2, 3), torch.zeros(4),
                           torch.full((2, 2), 7), torch.full((2,), 1.5), torch.randn(3, 4), torch.rand(2),
                           torch.empty(3, 2), torch.eye(3), torch.tensor([1.0, 2.0])), ()),
    "reductions": (lambda x: (x.sum(), x.mean(1, keepdim=True), x.max(dim=0), x.argmax(), x.var(0),
                              x.amax((0, 1)), x.norm()), (_r(3, 4, grad=True),)),
    "type_promotion": (lambda x, i: (x + i, i * 2.5, i / 2, i // 2, x + torch.tensor(2.0, dtype=torch.float64)),
                       (_r(3, dtype=torch.float16), torch.arange(3))),
    "comparison": (lambda x: (x > 0, (x > 0) & (x < 1), ~(x > 0)), (_r(3, 2),)),
    "squeeze_unsqueeze_flatten": (lambda x: (x.unsqueeze(1).squeeze(), x.flatten(), x[None].flatten(1)),
                                  (_r(2, 3, grad=True),)),
    "repeat_tile_flip": (lambda x: (x.repeat(2, 1), x.tile((1, 2)), x.flip(0), x.roll(1, 0)), (_r(2, 3),)),
    "cumsum_sort_topk": (lambda x: (x.cumsum(0), x.sort(dim=1), x.topk(2)), (_r(3, 5),)),
    "gather_scatter": (lambda x, i: (x.gather(1, i), torch.zeros(3, 5).scatter(1, i, 1.0)),
                       (_r(3, 5), torch.tensor([[0, 1], [2, 3], [4, 0]]))),
    "tril_triu_diag": (lambda x: (x.tril(), x.triu(1), x.diagonal(), torch.diag(x)), (_r(4, 4),)),
    "narrow_select_unfold": (lambda x: (x.narrow(1, 1, 2), x.select(0, 1), x.unfold(1, 2, 1)), (_r(3, 4),)),
    "as_strided": (lambda x: x.as_strided((2, 2), (1, 2), 1), (_r(8),)),
}


@pytest.mark.parametrize("name", sorted(TENSOR_METHODS))
def test_tensor_methods_match_eager(name):
    fn, inputs = TENSOR_METHODS[name]
    _check(fn, *inputs, what=name)


def test_batch_norm_aten_outputs_match_cpu():
    aten = torch.ops.aten
    x, w, rm, rv = _r(2, 3, 4), _r(3), torch.zeros(3), torch.ones(3)
    for training in (True, False):
        _check(lambda *a: aten.native_batch_norm(*a, training, 0.1, 1e-5), x, w, w, rm, rv)
        _check(lambda *a: aten._native_batch_norm_legit(*a, training, 0.1, 1e-5), x, w, w, rm, rv)
    _check(lambda *a: aten._native_batch_norm_legit_no_training(*a, 0.1, 1e-5), x, w, w, rm, rv)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_batch_norm_inference_shortcut_matches_the_meta_kernel(dtype):
    # the fast answer for eval batch norm must equal the meta kernel's in every layout it takes
    from ember.fake_fixups import _batch_norm_inference_meta
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    inputs = [torch.empty(2, 3, 4, 5, dtype=dtype, device="meta"),
              torch.empty(2, 3, 4, 5, dtype=dtype, device="meta").to(memory_format=torch.channels_last),
              torch.empty(2, 3, 4, 5, 6, dtype=dtype, device="meta").to(
                  memory_format=torch.channels_last_3d),
              torch.empty(8, 3, dtype=dtype, device="meta"), torch.empty(2, 3, 7, dtype=dtype, device="meta"),
              torch.empty(2, 4, 5, 3, dtype=dtype, device="meta").permute(0, 3, 1, 2)]
    for x in inputs:
        for w in (torch.empty(3, dtype=dtype, device="meta"), None):
            stats = torch.empty(3, dtype=torch.float32 if dtype.itemsize == 2 else dtype, device="meta")
            fast, slow = _batch_norm_inference_meta(x, w, w, stats, stats, 0.1, 1e-5), \
                op(x, w, w, stats, stats, 0.1, 1e-5)
            for f, s in zip(fast, slow):
                assert (f.shape, f.stride(), f.dtype) == (s.shape, s.stride(), s.dtype), (x.stride(), w)
    strided = torch.empty(2, 3, 8, dtype=dtype, device="meta")[..., ::2]
    assert _batch_norm_inference_meta(strided, None, None, stats, stats, 0.1, 1e-5) is None


def test_no_grad_outputs_do_not_require_grad():
    def fn(x, w):
        with torch.no_grad():
            a = x @ w
        b = x @ w
        return a, b
    fake = _check(fn, _r(2, 3, grad=True), _r(3, 4, grad=True))
    assert not fake[0].requires_grad and fake[1].requires_grad and fake[1].grad_fn is not None


def test_inplace_and_out_preserve_identity():
    mode = FakeTensorMode()
    with mode:
        x = torch.zeros(3, 4)
        y = x.add_(1)
        assert y is x
        assert x.mul_(2) is x and x.relu_() is x and x.clamp_(0, 1) is x
        assert x.copy_(torch.ones(3, 4)) is x
        assert x.zero_() is x and x.fill_(2.0) is x
        v = x[1:]
        assert v.mul_(3) is v
        out = torch.empty(3, 4)
        assert torch.add(x, 1, out=out) is out
        assert torch.mm(x, torch.ones(4, 2), out=torch.empty(3, 2)).shape == (3, 2)
        # a no-op conversion still yields a new tensor, like eager
        z = torch.ops.aten._to_copy(x)
        assert z is not x and z.shape == x.shape


def test_mask_setitem_keeps_identity_and_shape():
    def fn(x, m):
        x = x.clone()
        x[m] = 0.0
        y = x.masked_fill(m, 1.0)
        return x, y, torch.index_put(x, (m,), torch.tensor(2.0))
    _check(fn, _r(3, 4, grad=True), torch.rand(3, 4) > 0.5)
    mode = FakeTensorMode()
    with mode:
        x = torch.zeros(3, 4)
        m = x > 0
        assert x.index_put_((m,), torch.tensor(1.0)) is x


def test_inplace_on_leaf_requiring_grad_raises_like_eager():
    mode = FakeTensorMode()
    x = mode.from_real(torch.zeros(3, requires_grad=True))
    with mode, pytest.raises(RuntimeError, match="leaf Variable"):
        x.add_(1)


def test_inplace_autograd_rebase_matches_eager():
    def fn(x):
        y = x * 2
        y.add_(1)
        y[0] = 0.0
        return y
    fake = _check(fn, _r(3, grad=True))
    assert fake.grad_fn is not None


def test_views_report_stride_offset_and_share_storage():
    mode = FakeTensorMode()
    real = torch.randn(4, 6)
    x = mode.from_real(real)
    with mode:
        v = x[1:, 2:5]
        t = x.t()
    assert v.stride() == (6, 1) and v.storage_offset() == 8 and v.shape == (3, 3)
    assert t.stride() == (1, 6)
    st = x._meta.untyped_storage()._cdata
    assert v._meta.untyped_storage()._cdata == st == t._meta.untyped_storage()._cdata
    # fakes of real views of one storage share one meta storage too
    rv = real[2:]
    fv = mode.from_real(rv)
    assert fv.storage_offset() == 12 and fv._meta.untyped_storage()._cdata == st


def test_from_real_is_memoized_and_preserves_metadata():
    mode = FakeTensorMode()
    p = torch.nn.Parameter(torch.randn(3, 5))
    t = torch.randn(5, 3).t()
    fp, ft = mode.from_real(p), mode.from_real(t)
    assert mode.from_real(p) is fp and mode.from_real(t) is ft
    assert fp.requires_grad and isinstance(fp, torch.nn.Parameter) and fp.is_leaf
    assert ft.stride() == t.stride() and not ft.requires_grad
    assert mode.from_real(fp) is fp
    assert repr(ft) == "FakeTensor(size=(3, 5), dtype=torch.float32, device='cpu')"
    # memo entries die with the real tensor
    n = len(mode._memo)
    del t
    gc.collect()
    assert len(mode._memo) == n - 1


def test_real_tensors_in_args_are_fakified():
    const = torch.ones(3)
    mode = FakeTensorMode()
    with mode:
        x = torch.zeros(2, 3)
        y = x + const
    assert is_fake(y) and y.shape == (2, 3)
    assert const.sum().item() == 3.0                 # the real tensor is untouched


def test_unsupported_layouts():
    mode = FakeTensorMode()
    with pytest.raises(FakeUnsupported, match="sparse"):
        mode.from_real(torch.eye(3).to_sparse())
    with pytest.raises(FakeUnsupported, match="quantized"):
        mode.from_real(torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8))
    with pytest.raises(FakeUnsupported, match="nested"):
        mode.from_real(torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]))


def test_cuda_factories_and_to_report_cuda_device():
    mode = FakeTensorMode()
    with mode:
        a = torch.randn(2, 3, device="cuda")
        b = torch.zeros(3, device="cuda:0")
        c = torch.arange(4, device="cuda")
        d = torch.full((2,), 1.0, device="cuda")
        e = torch.rand(2, device="cuda")
        f = torch.ones(2, 3).to("cuda")
        g = torch.ones(2, 3).cuda()
        h = torch.tensor([1.0, 2.0], device="cuda")
        y = a + b                       # stays on cuda
        z = a * torch.tensor(2.0)       # a 0-dim cpu tensor does not decide the device
        w = (a @ f.t()).to(torch.float16)
        back = w.to("cpu")
        like = torch.zeros_like(a)
        s = F.softmax(a, -1)
    for t in (a, b, c, d, e, f, g, h, y, z, w, like, s):
        assert str(t.device) == "cuda:0" and t.is_cuda, t
    assert str(back.device) == "cpu"
    assert w.dtype == torch.float16 and w.shape == (2, 2)
    assert "device='cuda:0'" in repr(a)


def test_cuda_autograd():
    mode = FakeTensorMode()
    with mode:
        w = torch.randn(4, 3, device="cuda", requires_grad=True)
        x = torch.randn(2, 3).to("cuda")
        y = F.linear(x, w).relu().sum()
    assert y.requires_grad and y.grad_fn is not None and str(y.device) == "cuda:0"


def test_mixed_device_error():
    mode = FakeTensorMode()
    with mode:
        a = torch.randn(2, 3, device="cuda")
        b = torch.randn(2, 3)
        with pytest.raises(RuntimeError, match="device"):
            a + b
        with pytest.raises(RuntimeError, match="device"):
            torch.cat([a, b])
        # indexing a cuda tensor with cpu indices is allowed, like eager
        assert str(a[torch.tensor([0, 1])].device) == "cuda:0"


def test_data_dependent_errors():
    mode = FakeTensorMode()
    x = mode.from_real(torch.randn(3))
    with mode:
        for fn, op in [(lambda: x.item(), "_local_scalar_dense"), (lambda: bool(x > 0), "is_nonzero"),
                       (lambda: int(x.sum()), "_local_scalar_dense"), (lambda: float(x[0]), "_local_scalar_dense"),
                       (lambda: x.tolist(), "_local_scalar_dense"), (lambda: torch.nonzero(x), "nonzero"),
                       (lambda: x[x > 0], None), (lambda: x.masked_select(x > 0), "masked_select"),
                       (lambda: torch.unique(x), "unique"), (lambda: torch.equal(x, x), "equal"),
                       (lambda: (x > 0).any().item(), "_local_scalar_dense"),
                       (lambda: x.sum().numpy(), "numpy")]:
            with pytest.raises(DataDependentError) as info:
                fn()
            if op is not None:
                assert op in info.value.op
    # DataDependentError is a RuntimeError
    assert issubclass(DataDependentError, RuntimeError) and issubclass(FakeUnsupported, RuntimeError)


def test_shape_errors_propagate_like_eager():
    mode = FakeTensorMode()
    with mode:
        with pytest.raises(RuntimeError, match="broadcast|size"):   # eager's type; wording may differ
            torch.zeros(2, 3) + torch.zeros(4)
        with pytest.raises(RuntimeError):
            torch.zeros(2, 3) @ torch.zeros(2, 3)


def test_random_ops_do_not_consume_rng():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    mode = FakeTensorMode()
    with mode:
        torch.randn(100)
        F.dropout(torch.ones(10), 0.5)
        torch.rand(3, device="cuda")
    assert torch.equal(torch.rand(1), expected)


def test_ops_outside_mode_use_tensor_mode():
    mode = FakeTensorMode()
    x = mode.from_real(torch.randn(2, 3, requires_grad=True))
    y = (x * 2).sum(0)                 # no mode active: dispatched through x's mode
    assert is_fake(y) and y.shape == (3,) and y.requires_grad


def test_resnet_block_module():
    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10))
    x = torch.randn(2, 3, 8, 8)
    real = block(x)
    before = block[1].running_mean.clone()
    mode = FakeTensorMode()
    with mode:
        fx = mode.from_real(x)
        out = block(fx)
        loss = F.cross_entropy(out, torch.tensor([1, 2]))
    _assert_same_meta(real, out)
    assert loss.requires_grad and loss.shape == ()
    assert torch.equal(block[1].running_mean, before)        # no real mutation happened
    assert block[1].num_batches_tracked.item() == 1


def test_mode_reentry_and_nesting():
    m1, m2 = FakeTensorMode(), FakeTensorMode()
    with m1:
        with m1:
            a = torch.ones(2)
        with m2:
            b = torch.ones(2)
        c = torch.ones(2)
    assert a.fake_mode is m1 and b.fake_mode is m2 and c.fake_mode is m1
    assert not is_fake(torch.ones(2))             # everything restored


def test_inplace_metadata_mutation():
    def fn(x, y):
        x = x.clone()
        x.t_()
        assert x.unsqueeze_(0) is x
        x.squeeze_(0)
        y = y * 1
        y.transpose_(0, 1)
        z = torch.zeros(2, 3)
        z.resize_(5)                              # shrinking stays within the storage
        return x, y, z
    _check(fn, _r(3, 4), _r(2, 5, grad=True))
    mode = FakeTensorMode()
    with mode:
        x = torch.zeros(2, 3)
        with pytest.raises(FakeUnsupported, match="growth"):
            x.resize_(10)
        with pytest.raises(FakeUnsupported, match="growth"):
            torch.add(x, 1, out=torch.empty(0))
        assert x.shape == x._meta.shape == (2, 3) and (x + 1).shape == (2, 3)


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch < 2.13 quantile checks its input with aten.equal, which reads "
                           "tensor data (data-dependent on fakes)")
def test_quantile_uses_inplace_squeeze():
    q = _check(lambda x: torch.quantile(x, 0.5, dim=1), _r(3, 4))   # uses squeeze_ inside
    assert q.shape == (3,)


def test_backward_and_deepcopy():
    import copy
    mode = FakeTensorMode()
    lin = torch.nn.Linear(4, 3)
    with mode:
        w = mode.from_real(lin.weight)
        loss = F.linear(torch.randn(2, 4), w).sum()
        loss.backward()
        assert is_fake(w.grad) and w.grad.shape == (3, 4)
        w2 = copy.deepcopy(w)
        assert is_fake(w2) and w2 is not w and w2.requires_grad and isinstance(w2, torch.nn.Parameter)
    assert lin.weight.grad is None


def test_views_of_one_real_storage_share_meta_storage_after_base_dies():
    mode = FakeTensorMode()
    base = torch.randn(10)
    v1, v2 = base[2:], base[:5]
    del base
    f1, f2 = mode.from_real(v1), mode.from_real(v2)
    assert f1._meta.untyped_storage()._cdata == f2._meta.untyped_storage()._cdata
    assert f1.storage_offset() == 2 and f2.storage_offset() == 0


def test_repeated_ops_answer_from_the_result_cache():
    """A second op with the same arguments' geometry gets new fakes of the right geometry
    (fresh storage, nothing aliased) without running the meta kernel again; views, other
    strides and multi-output ops are right too."""
    from ember.fake import FakeTensorMode
    mode = FakeTensorMode()
    a = mode.from_real(torch.randn(4, 6))
    b = mode.from_real(torch.randn(4, 6))
    with mode:
        first, second = a + b, a + b
        assert first.shape == second.shape == (4, 6) and second.stride() == (6, 1)
        assert first._meta.untyped_storage()._cdata != second._meta.untyped_storage()._cdata
        assert len(mode._results) >= 1
        t, t2 = a.t(), a.t()                       # views: never from the cache
        assert t.stride() == (1, 6)
        assert t2._meta.untyped_storage()._cdata == a._meta.untyped_storage()._cdata
        real_c, real_b = torch.randn(6, 4).t(), torch.randn(4, 6)
        c = mode.from_real(real_c)                 # same shape as a, other strides
        assert (c + b).stride() == (real_c + real_b).stride()
        assert (c * 2).stride() == (real_c * 2).stride() == (1, 4)
        values, indices = torch.max(a, dim=1)
        values2, indices2 = torch.max(b, dim=1)
        assert type(torch.max(b, dim=1)).__name__ == type(torch.max(a, dim=1)).__name__
        assert indices2.dtype == torch.int64 and values2.shape == (4,)
        wide = a.to(torch.float64) + 1
        assert wide.dtype == torch.float64


def test_map_args_matches_pytree():
    """The fast argument map gives pytree.tree_map's answer, falling back to it for
    containers ATen arguments do not use."""
    import collections

    import torch.utils._pytree as pytree

    from ember.fake import map_args
    pair = collections.namedtuple("pair", "a b")
    t = torch.ones(2)
    cases = [((t, 1, None, [t, t], (2, 3.0)), {"dim": [0], "out": t}),
             ((torch.Size([2, 3]), [[1, 2], (t,)]), {}),
             ((pair(t, 1),), {"nested": {"x": t}})]

    def fn(v):
        return v + 1 if isinstance(v, (int, torch.Tensor)) and not isinstance(v, bool) else v
    for args, kwargs in cases:
        got, want = map_args(fn, args, kwargs), pytree.tree_map(fn, (args, kwargs))
        assert repr(got) == repr(want)
        assert [type(x) for x in got[0]] == [type(x) for x in want[0]]


def test_fake_of_an_intermediate_is_a_non_leaf_that_takes_in_place_writes():
    mode = FakeTensorMode()
    leaf = torch.randn(3, requires_grad=True)
    inner = leaf * 2
    fake_leaf, fake_inner = mode.from_real(leaf), mode.from_real(inner)
    assert fake_leaf.is_leaf and fake_leaf.requires_grad
    assert not fake_inner.is_leaf and fake_inner.requires_grad
    assert fake_inner._base is None and mode.from_real(inner) is fake_inner
    with mode:
        fake_inner[0] = 0          # allowed on the real one, so on its fake
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            fake_leaf[0] = 0
    with torch.no_grad():
        plain = mode.from_real(inner.detach())
    assert plain.is_leaf and not plain.requires_grad
