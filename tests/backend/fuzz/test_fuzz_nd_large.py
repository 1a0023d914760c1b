"""Random 4-D programs (``fuzz_nd_programs.py``) at a large shape on the C++ target, judged
against float64 (``float64_difference``): sizes that reach what the small fuzz never does
(split reductions, column sums across a row kernel's rows, parallel chunks), with static and
symbolic sizes. Seed 741 with symbolic sizes saves a slice of an intermediate for the
backward: gradients of 1e20 before 0d7dfff. A failure names the program; reproduce it with
``float64_difference(SEED, LARGE, train=True, dynamic=...)`` from this folder."""
import pytest

from ember import config

from fuzz_nd_programs import float64_difference

LARGE = (16, 24, 32, 40)
SEEDS = [741, 10, 36, 60, 109, 138]


@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("seed", SEEDS)
def test_large_nd_program_gradients_are_as_accurate_as_eagers(seed, dynamic, monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        assert float64_difference(seed, LARGE, train=True, dynamic=dynamic) is None
