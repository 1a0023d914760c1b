"""The C++ prelude every kernel library starts with: includes, and the inline helpers
(``ember_*``) that generated kernels call: NaN-propagating max/min, float exp/erf/tanh
as inline code (so loops calling them vectorise), checked integer division, Welford
updates, Philox random numbers.

The C++ is ``prelude.h`` beside this file (read once, at import), so it reads and edits as
C++; this module adds the constants it shares with the code generator (``CASCADE``).
"""
import importlib.resources

CASCADE = 128                    # steps a fine sum/Welford accumulator takes before folding

# the C++ text, package data (pyproject.toml's package-data ships it in the wheel)
PRELUDE = "#define EMBER_CASCADE %d\n\n" % CASCADE + \
    importlib.resources.files(__package__).joinpath("prelude.h").read_text(encoding="utf-8")
