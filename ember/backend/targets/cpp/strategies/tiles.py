"""Transposed tiles: a pointwise kernel that reads some input along its last outer dim (stride
1) while it writes along its inner dim (``x.t().contiguous()``, an NCHW -> NHWC copy) runs
over tiles of TILE_X outer by ``TILE_BYTES / element size`` inner elements. Each tile of such
a read is first copied, transposed, into a local array (``ember_transpose_tile``: vector
shuffles of 8 x 8 blocks), then the body runs row by row over the tile with every access
contiguous. Untiled, each element of the read touches a new cache line (and, 4 KiB apart, the
same L1 set): 4096 x 1024 floats took 31 ms, 1 thread; tiled 2.2 ms (eager's blocked copy 4.9).
"""
from __future__ import annotations

import sympy

from ember.backend.ir import product
from ember.backend.loops import linear_coefficients
from ember.backend.ops import use_handler
from ember.backend.scheduler import FusionGroup, node_reads
from ember.backend import sizevars
from ember.backend.sizevars import size_hint
from ember.backend.targets.cpp.ops import cpp_index, storage_type
from ember.backend.targets.cpp.strategies.base import PARALLEL_MIN_INNER, LoopStrategy

TILE_X = 64                      # outer elements of a tile
TILE_BYTES = 64                  # inner extent of a tile: one cache line of each row
TILE_MIN_STRIDE_BYTES = 64       # a read whose elements are this far apart along the inner dim
TILE_MIN_SIDE = 8                # ... in a loop nest this long both ways (one 8 x 8 block)
# ... and whose untiled loop would not find its lines in cache again: an inner loop touches
# one line per element, which the next outer iterations reuse while those lines (at most
# this many bytes) stay in L1, unless their stride is a multiple of 4 KiB (then they all
# fall in one L1 set). Untiled, NCHW -> NHWC of [32, 64, 56, 56] floats took 4.1 ms, tiled
# 4.6 (1 thread); [64, 65536].t() 12.4 untiled, 3.2 tiled (eager 4.4-5.2 each)
TILE_CACHED_BYTES = 16 << 10


class _Reads:
    """An ops handler recording each load, and whether it happens under a mask (a padded or
    concatenated read: elements outside the mask may lie outside the buffer)."""

    def __init__(self):
        self.reads: list[tuple[str, sympy.Expr, bool]] = []
        self.masked_depth = 0
        self.indirect = 0

    def load(self, name, index):
        self.reads.append((name, sympy.expand(index), self.masked_depth > 0))
        return 0

    def indirect_indexing(self, *args, **kwargs):
        self.indirect += 1
        return sympy.Symbol(f"indirect{self.indirect}", integer=True)

    def masked(self, mask, body, other):
        self.masked_depth += 1
        try:
            return body()
        finally:
            self.masked_depth -= 1

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


def _coefficients(index, last, var):
    """``stride`` where ``index`` is ``offset + last + stride * var`` with neither variable
    in ``offset`` or ``stride`` (a number, or a product of size symbols), else None."""
    linear = linear_coefficients(index, (last, var))
    if linear is not None:
        c_last, stride = linear
    else:
        c_last, stride = sympy.diff(index, last), sympy.diff(index, var)
    stride = sympy.sympify(stride)
    if c_last != 1 or stride.free_symbols & {last, var}:
        return None
    rest = sympy.expand(index - last - stride * var)
    return None if rest.free_symbols & {last, var} else stride


def transposed_reads(group: FusionGroup, x, r, dtypes, written) -> dict:
    """``{(buffer, index): (offset, stride)}`` of the reads worth tiling: unmasked, of memory
    the kernel does not write, ``offset + x_last + stride * r`` with ``stride`` at least
    TILE_MIN_STRIDE_BYTES apart (``offset`` free of both). Empty where the kernel does not
    fit: not pointwise, not one inner dim, or its first store not contiguous in it."""
    if (len(group.inner) != 1 or not group.outer
            or any(n.role != "inner" for n in group.nodes)):
        return {}
    xs = x[:len(group.outer)]
    last, var = xs[-1], r[0]
    if not isinstance(last, sympy.Symbol) or min(size_hint(group.outer[-1]),
                                                  size_hint(group.inner[0])) < TILE_MIN_SIDE:
        return {}
    store = sympy.expand(group.nodes[0].where(x, r))
    if sympy.diff(store, var) != 1:
        return {}
    # the offset may read the other outer variables and symbolic sizes
    allowed = {v.name for v in xs[:-1] if isinstance(v, sympy.Symbol)} | \
        sizevars.symbol_names()
    found = {}
    for node in group.nodes:        # (the scheduler's cached reads: cheap to ask)
        for name, index in node_reads(node, x, r):
            stride = None if name in written else _coefficients(index, last, var)
            if stride is None:
                continue
            offset = sympy.expand(index - last - stride * var)
            names = {s.name for s in offset.free_symbols | stride.free_symbols}
            step = abs(size_hint(stride)) * dtypes[name].itemsize      # bytes
            cached = size_hint(group.inner[0]) * 64 <= TILE_CACHED_BYTES and step % 4096 != 0
            if names <= allowed and step >= TILE_MIN_STRIDE_BYTES and not cached:
                found[(name, index)] = (offset, stride)
    if not found:
        return found
    # only reads made without a mask somewhere (then in bounds everywhere): a masked one's
    # elements outside the mask may lie outside the buffer
    recorder = _Reads()
    with use_handler(recorder):
        for node in group.nodes:
            node.value(x, r)
    unmasked = {(name, index) for name, index, masked in recorder.reads if not masked}
    return {key: value for key, value in found.items() if key in unmasked}


class TransposedTiles(LoopStrategy):
    """The whole kernel, over tiles (see the module docstring)."""

    def __init__(self, kernel, reads: dict):
        super().__init__(kernel)
        self.reads = reads
        self.tiles: dict = {}         # (buffer, index) -> the tile array's name
        sizes = [kernel.dtypes[name].itemsize for name, _ in reads]
        sizes.append(kernel.group.nodes[0].buf.get_dtype().itemsize)
        self.tile_r = TILE_BYTES // min(sizes)

    def tiled_element(self, name: str, index) -> str | None:
        tile = self.tiles.get((name, sympy.expand(index)))
        return None if tile is None else f"{tile}[xl * {self.tile_r} + rl]"

    def generate(self, x, r) -> None:
        k = self.k
        group = k.group
        xs = x[:len(group.outer)]
        last, var = xs[-1], r[0]
        tx, tr = TILE_X, self.tile_r
        nx, nr = cpp_index(group.outer[-1]), cpp_index(group.inner[0])
        blocks_x, blocks_r = f"(({nx} + {tx - 1}) / {tx})", f"(({nr} + {tr - 1}) / {tr})"
        total = size_hint(product(group.outer + group.inner))
        tiles = size_hint(product(group.outer[:-1])) * \
            -(-size_hint(group.outer[-1]) // tx) * -(-size_hint(group.inner[0]) // tr)
        if total >= PARALLEL_MIN_INNER and tiles >= 2:
            self.line(f"#pragma omp parallel for collapse({len(xs) + 1})")
        for v, n in zip(xs[:-1], group.outer[:-1]):
            self.open(f"for (int64_t {v} = 0; {v} < {cpp_index(n)}; {v}++) {{")
        self.open(f"for (int64_t xt = 0; xt < {blocks_x}; xt++) {{")
        self.open(f"for (int64_t rt = 0; rt < {blocks_r}; rt++) {{")
        self.line(f"const int64_t xb = xt * {tx}, x_len = std::min<int64_t>({tx}, {nx} - xb);")
        self.line(f"const int64_t rb = rt * {tr}, r_len = std::min<int64_t>({tr}, {nr} - rb);")
        k.push()
        for (name, index), (offset, stride) in self.reads.items():
            tile = f"t{len(self.tiles)}_{name}"
            ctype = storage_type(k.dtypes[name])
            start = cpp_index(offset + sympy.Symbol("xb", integer=True) +
                              stride * sympy.Symbol("rb", integer=True))
            self.line(f"{ctype} {tile}[{tx * tr}];")
            self.line(f"ember_transpose_tile<{tr}>(p_{name} + {start}, {cpp_index(stride)}, "
                      f"{tile}, x_len, r_len);")
            k.loaded.add(name)
            self.tiles[(name, index)] = tile
        self.open("for (int64_t xl = 0; xl < x_len; xl++) {")
        self.line(f"const int64_t {last} = xb + xl;")
        with k._hoisting():
            self.line("#pragma omp simd")
            self.open("for (int64_t rl = 0; rl < r_len; rl++) {")
            self.line(f"const int64_t {var} = rb + rl;")
            self.loop_body(group.nodes, {}, x, r, None)
            self.close()
        self.close()
        k.pop()
        self.close()
        self.close()
        for _ in xs[:-1]:
            self.close()
