"""Writes through views of computed values (``fuzz_view_writes.py``) compiled on both CPU
targets against eager, values, strides and gradients: fixed seeds, so a failure names a
program to reproduce with ``python tests/backend/fuzz/fuzz_view_writes.py SEED 1 [train]``."""
import pytest

from ember import config

from fuzz_view_writes import difference


@pytest.mark.parametrize("seed", range(16))
def test_view_writes_match_eager(seed, cpu_backend):
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        assert difference(seed) is None


@pytest.mark.parametrize("seed", range(8))
def test_view_writes_gradients_match_eager(seed, cpu_backend):
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        assert difference(seed, train=True) is None
