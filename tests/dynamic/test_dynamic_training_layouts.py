"""Training graphs with symbolic sizes (``dynamic=True``): what the forward saves has the
strides the backward was compiled for, and a backward that takes no saved value or tangent
still takes the size inputs. Both found by the 4-D fuzzer at large shapes.

A slice of an intermediate keeps eager's strides, gaps included, when it is an output (a
saved value is one): with symbolic sizes, ``x.roll(2, 1).select(1, 0)`` of an (s0, s1, s0,
s0) tensor has strides (s1*s0**2, s0, 1), whose gaps could not be proven not to overlap
(``s1*s0**2 - s0**2`` has no lower bound term by term; factored, ``s0**2*(s1 - 1)`` does).
The forward returned it contiguous, the backward read it with the gapped strides: gradients
of up to 1e20 (reads past the buffer)."""
import torch

import ember
from ember import config


def _rolled_row(x):
    v = x.roll(2, 1).select(1, 0).unsqueeze(1).expand_as(x) * 1.0
    return v.clamp(min=0) ** 1.5


def _grad(fn, x):
    x = x.clone().requires_grad_()
    out = fn(x)
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape)
    return torch.autograd.grad((out * weights).sum(), x)[0]


def test_a_saved_slice_keeps_its_strides_for_the_backward(monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    torch.manual_seed(0)
    compiled = ember.compile(_rolled_row, backend="ember", dynamic=True)
    with config.patch(suppress_errors=False):
        for shape in [(2, 3, 2, 2), (4, 6, 5, 5)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(_grad(compiled, x), _grad(_rolled_row, x))


def test_a_gapped_slice_output_has_eagers_strides_with_symbolic_sizes(monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    fn = lambda x: (x * 2).select(1, 0)      # noqa: E731
    compiled = ember.compile(fn, backend="ember", dynamic=True)
    with config.patch(suppress_errors=False):
        for shape in [(2, 3, 4), (5, 7, 6)]:
            x = torch.randn(*shape)
            got, want = compiled(x), fn(x)
            assert got.stride() == want.stride()
            torch.testing.assert_close(got, want)


def test_outputs_without_a_gradient_path_compile_with_symbolic_sizes(monkeypatch):
    """argmax's output needs no gradient: the backward has no input but the sizes (an
    IndexError before, and the graph recompiled per size)."""
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")

    def fn(x):
        return x.logsumexp(2, keepdim=True).argmax(2, keepdim=True).float().prod(0)

    compiled = ember.compile(fn, backend="ember", dynamic=True)
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        for shape in [(8, 4, 5, 5), (6, 3, 7, 7)]:
            x = torch.randn(*shape).to(memory_format=torch.channels_last).requires_grad_()
            torch.testing.assert_close(compiled(x), fn(x))


def test_a_saved_value_in_other_strides_is_copied_into_the_backwards(monkeypatch, ember_log):
    """Whatever layout the forward returns a saved value in, the backward reads it in the
    strides it was compiled for: with the gapped slice's bound left unproven (the ranges
    term by term, as before 0d7dfff), the forward returns it contiguous and the call copies
    it (a perf hint says so) instead of reading past it."""
    from ember.backend import sizevars
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")

    def unfactored(diff) -> bool:
        if diff.is_Integer:
            return int(diff) >= 0
        env = sizevars.shape_env()
        try:
            return bool(diff.is_nonnegative) or (
                env is not None and bool(env.bound(diff).lower >= 0))
        except (TypeError, AttributeError):
            return False

    monkeypatch.setattr(sizevars, "_known_nonnegative", unfactored)
    torch.manual_seed(0)
    compiled = ember.compile(_rolled_row, backend="ember", dynamic=True)
    ember.logs.set_logs("perf_hints")
    with config.patch(suppress_errors=False):
        for shape in [(2, 3, 2, 2), (4, 6, 5, 5)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(_grad(compiled, x), _grad(_rolled_row, x))
    assert any("the backward reads" in r.getMessage() for r in ember_log.records)
