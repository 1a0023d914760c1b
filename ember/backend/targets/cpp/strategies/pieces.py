"""Split pieces: a pointwise loop cut where its range conditions change (a concatenation's
parts), one plain loop per piece, in which those conditions are constants."""
from __future__ import annotations

import sympy

from ember.backend.ops import use_handler
from ember.backend.scheduler import FusionGroup
from ember.backend.sizevars import is_static, size_hint
from ember.backend.targets.cpp.ops import _RangeProbe
from ember.backend.targets.cpp.strategies.plain import PlainLoop

MAX_PIECES = 64     # a loop splits into at most this many + 1 pieces (see SplitPieces.cuts)


class SplitPieces(PlainLoop):
    """The loop as one loop per range between ``cuts``: within each, the range
    conditions fold to constants (``CppOpsHandler._fold``), so a concatenation's piece
    loads one part, with no branch (deeplabv3's 5-way ASPP concatenation of 14x14x1280:
    0.84 ms with a masked load per part in one loop)."""

    def __init__(self, kernel, cuts: list[int]):
        super().__init__(kernel)
        self.cuts = cuts
        # the piece being generated: its var and [start, end)
        self.piece: tuple[sympy.Symbol, int, int] | None = None

    @staticmethod
    def find_cuts(group: FusionGroup, nodes, x, r) -> list[int]:
        """Where a pointwise loop over one inner dim splits so that each piece decides its
        range conditions: the starts of a concatenation's parts along that dim (a
        channels-last ``cat`` of channels), found by evaluating the bodies under
        ``_RangeProbe``. Empty when there are none, or too many."""
        if len(r) != 1 or not is_static(group.inner[0]):
            return []
        probe = _RangeProbe(r[0])
        try:
            with use_handler(probe):
                for node in nodes:
                    node.value(x, r)
        except (AttributeError, TypeError):   # a body that inspects its values: no cuts
            return []
        n = size_hint(group.inner[0])
        cuts = sorted(c for c in probe.cuts if 0 < c < n)
        return cuts if len(cuts) <= MAX_PIECES else []

    def index_bounds(self, expr) -> tuple[int, int] | None:
        """``var + c`` over the piece."""
        if self.piece is None:
            return None
        var, start, end = self.piece
        shift = sympy.expand(expr - var)
        return (start + int(shift), end - 1 + int(shift)) if shift.is_Integer else None

    def generate(self, nodes, x, r) -> None:
        bounds = [0, *self.cuts, size_hint(self.k.group.inner[0])]
        for start, end in zip(bounds, bounds[1:]):
            self.piece = (r[0], start, end)
            try:
                super().generate(nodes, {}, x, r, str(start), str(end))
            finally:
                self.piece = None
