"""The C++ kernel's loop strategies: each a class that generates one shape of loop nest,
keeping the state only it needs; ``CppKernel`` (``../kernel.py``) chooses one and delegates.

- ``base.py``: :class:`LoopStrategy`, what they share (emission, the body of one inner-loop
  step, reductions' accumulators and final values).
- ``column.py``: :class:`ColumnBlocks`, a whole kernel whose memory runs along its last
  outer dim, a SIMD block of that dim's lanes at a time.
- ``plain.py``: :class:`PlainLoop`, an inner loop as written (``#pragma omp simd`` with
  reduction clauses).
- ``pieces.py``: :class:`SplitPieces`, a pointwise loop cut where its range conditions
  change (a concatenation's parts), each piece a plain loop with those conditions folded.
- ``precompute.py``: :class:`PrecomputedArrays`, a plain pointwise loop whose costly values
  that do not depend on the outer loops are computed once, into arrays, before them.
- ``chunks.py``: :class:`ParallelChunks`, a long reduction split over threads in fixed
  slices, merged in order.
- ``lanes.py``: :class:`LaneBlocks`, sums and Welford states over blocks of lanes, folded in
  two levels (:class:`FoldingStrategy`, shared with column blocks).
- ``rows.py``: :class:`RowSums`, a sum over several inner dims, a row at a time.
- ``tiles.py``: :class:`TransposedTiles`, a whole pointwise kernel that reads an input along
  its outer dim, over tiles of which that read is first copied transposed.
- ``table.py``: :class:`HalfTable`, a whole pointwise kernel whose values are functions of
  one float16 or bfloat16 input, looked up in 65536-entry tables its first call fills.

A strategy imports no kernel module (the kernel imports them).
"""
