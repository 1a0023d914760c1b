"""Random programs (``fuzz_programs.py``) compiled on both CPU targets against eager: fixed
seeds, so a failure names a program to reproduce with
``python tests/backend/fuzz/fuzz_programs.py SEED 1``. Seed 241 is a softmax whose quotient its
own kernel reads again (code generation failed before 236eb1c); seeds 0-39 return strided
slices of intermediates (contiguous before ee0a023)."""
import pytest

from ember import config

from fuzz_programs import difference

SEEDS = list(range(40)) + [241]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_program_matches_eager(seed, cpu_backend):
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        assert difference(seed) is None
