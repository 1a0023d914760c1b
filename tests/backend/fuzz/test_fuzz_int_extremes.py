"""Integer-semantics and extreme-value programs (``fuzz_int_extremes.py``) compiled on both
CPU targets against eager: fixed seeds, so a failure names a program to reproduce with
``python tests/backend/fuzz/fuzz_int_extremes.py SEED 1 [cpp|triton]``. Each program is one
compiled graph of 4 to 10 checks (or one division by zero, which must raise eager's
exception). Before 823e92a the C++ target's zero divisors killed the process; before
63b5783 8 of seeds 0-99 gave inf where eager's var/std are finite, and seeds 520 and 531
squared a norm over one element to inf; seeds 3, 102 and 121 divided by an int32 max of
uint8 values under the interpreter, and seeds 30, 644 and 735 clamped int8/uint8 values
to bounds they cannot hold (eager raises), before the commit that adds this file."""
import pytest
from conftest import INTERPRETED

from fuzz_int_extremes import difference

# overflow and invalid values are the point: numpy's warnings from the interpreter are not
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# a C++ program costs g++ builds (~0.3 s cold), an interpreted one ~0.06 s: 306 programs
# of 4 to 10 checks each, 30-70 s (longer sweeps: ``fuzz_int_extremes.py FIRST COUNT``)
CPP_SEEDS = list(range(48))
TRITON_SEEDS = list(range(48, 300)) + [3, 30, 520, 531, 644, 735]
CHUNK = 16


def _chunks(seeds):
    return [pytest.param(seeds[i:i + CHUNK], id=f"seeds{seeds[i]}")
            for i in range(0, len(seeds), CHUNK)]


def _check(seeds):
    found = [f"seed {s}: {d}" for s in seeds if (d := difference(s)) is not None]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("cpu_backend", ["cpp"], indirect=True)
@pytest.mark.parametrize("seeds", _chunks(CPP_SEEDS))
def test_cpp_programs_match_eager(seeds, cpu_backend):
    _check(seeds)


@pytest.mark.skipif(not INTERPRETED, reason="Triton's interpreter runs only with "
                    "TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)")
@pytest.mark.parametrize("cpu_backend", ["triton"], indirect=True)
@pytest.mark.parametrize("seeds", _chunks(TRITON_SEEDS))
def test_triton_programs_match_eager(seeds, cpu_backend):
    _check(seeds)
