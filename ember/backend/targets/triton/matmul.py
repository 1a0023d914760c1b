"""Triton matmul kernels that compute their pointwise epilogue before storing
(``templates.MatmulEpilogue``, under ``max_autotune``).

Each program computes an XBLOCK x RBLOCK tile of the [M, N] result with ``tl.dot`` over K in
chunks of KBLOCK, in float32, and programs are ordered in groups of GROUP_M row tiles so
neighbours share operand tiles in L2. The accumulator is the matmul's value at the tile's
(row, column) indices (rounded to its storage dtype, as a library call stores it); the
epilogue's nodes are then generated as in any 2-D tile (``TritonKernel``): the tile's rows
are the x axis, split into the epilogue's outer loops, its columns the r axis. Loads of the
matmul's result in the epilogue find the accumulator as a known value, so it is never
written to memory.

The same module holds the epilogue alone (``<name>_epilogue``), for the other choice: the
library's matmul, then that kernel (``launch.MatmulChoice`` times both).
"""
from __future__ import annotations

import torch

from ember.backend.targets.triton.kernel import TritonKernel, next_power_of_2
from ember.backend.targets.triton.ops import (HALF, TL_TYPES, TritonOpsHandler, TritonValue,
                                             triton_index)
from ember.backend.ir import flat_index, index_vars
from ember.backend.ops import use_handler
from ember.backend.targets.triton.templates import MATMULS

# (XBLOCK, RBLOCK, KBLOCK, num_stages, num_warps): the tiles timed per shape, largest
# first; a tile larger than the problem is shrunk to it (and duplicates dropped)
CONFIGS = [(128, 128, 64, 3, 8), (128, 256, 64, 3, 8), (256, 128, 64, 3, 8),
           (128, 128, 32, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
           (64, 64, 64, 3, 4), (64, 64, 32, 2, 4)]
INTERPRETER_CONFIG = (32, 32, 32, 1, 4)
GROUP_M = 8


def matmul_configs(m: int, n: int, k: int, dtype: torch.dtype, interpret: bool) -> list[dict]:
    """The configs timed for an [m, k] x [k, n] matmul: float32 tiles take half the K
    chunk (twice the bytes per element in shared memory)."""
    out: list[dict] = []
    for bm, bn, bk, stages, warps in ([INTERPRETER_CONFIG] if interpret else CONFIGS):
        if dtype == torch.float32 and not interpret:
            bk //= 2
        config = {"XBLOCK": min(bm, max(16, next_power_of_2(m))),
                  "RBLOCK": min(bn, max(16, next_power_of_2(n))),
                  "KBLOCK": min(bk, max(16, next_power_of_2(k))), "GROUP_M": GROUP_M,
                  "num_stages": stages, "num_warps": warps}
        if config not in out:
            out.append(config)
    return out


def matmul_grid(spec: dict, config: dict) -> tuple[int]:
    return (-(-spec["rows"] // config["XBLOCK"]) * -(-spec["cols"] // config["RBLOCK"]),)


class TritonMatmulKernel(TritonKernel):
    """One ``MatmulEpilogue``: the fused kernel, the epilogue alone, and ``matmul_spec``
    (what ``launch.MatmulChoice`` needs to run either)."""

    def __init__(self, kernel, name: str, dtypes: dict, interpret: bool = False,
                 debug: bool = False):
        super().__init__(kernel, name, dtypes, interpret=interpret, debug=debug)
        self.epilogue = TritonKernel(kernel, f"{name}_epilogue", dtypes, interpret=interpret,
                                     debug=debug)
        self.epilogue.is_epilogue = True
        self.matmul_spec: dict = {}

    kind = "mm"

    def rename(self, name: str) -> None:
        super().rename(name)     # its source holds the epilogue's: renamed with it
        self.epilogue.name = self.matmul_spec["epilogue"] = f"{name}_epilogue"

    def generate(self) -> str:
        self.epilogue.numels = self.numels
        epilogue_source = self.epilogue.generate()
        k = self.kernel
        mm, operands = k.matmul, k.operands
        a, b, bias = operands["a"], operands["b"], operands["bias"]
        rows, cols = (int(s) for s in mm.layout.size)
        depth = int(a.layout.size[1])
        dtype = mm.layout.dtype
        self.index_type = "tl.int64" if self._needs_int64() else "tl.int32"
        self.mode = "tiled"
        self.candidates = matmul_configs(rows, cols, depth, dtype, self.interpret)
        self.config = self.candidates[0]
        spec = {"rows": rows, "cols": cols}
        self.grid = matmul_grid(spec, self.config)
        with use_handler(TritonOpsHandler(self)):
            self._main_loop(a, b, rows, cols, depth, dtype)
            x, r = index_vars("x", len(k.outer)), index_vars("r", 1)
            self.line("xindex = rm[:, None]")
            self.line(f"xmask = xindex < {rows}")
            self._decompose("xindex", x, list(k.outer), "x")
            self.line("rindex = rn[None, :]")
            self.line(f"rmask = rindex < {cols}")
            self.line(f"{r[0]} = rindex")
            self.index_dims[r[0].name] = frozenset({"r"})
            value = self._matmul_value(bias, operands, dtype, x, r)
            self.set_value(mm.name, mm.layout.index([flat_index(x, k.outer), r[0]]), value)
            for node in k.nodes:
                self.store(node, node.where(x, r), node.value(x, r))
        if mm.name in self.loaded:
            raise AssertionError(f"{self.name}: the epilogue reads {mm.name} where the "
                                 f"accumulator is not")
        params = [f"p_{n}" for n in self._arg_names()] + \
            [f"{c}: tl.constexpr" for c in ("XBLOCK", "RBLOCK", "KBLOCK", "GROUP_M")]
        jit = "@triton.jit(debug=True)" if self.debug else "@triton.jit"
        head = f"{jit}\ndef {self.name}({', '.join(params)}):\n"
        self.matmul_spec = {
            **spec, "op": MATMULS[mm.kernel], "out": mm.name,
            "out_layout": (_ints(mm.layout.size), _ints(mm.layout.stride)),
            "operands": {role: None if t is None else
                         (t.name, _ints(t.layout.size), _ints(t.layout.stride),
                          int(t.layout.offset))
                         for role, t in (("a", a), ("b", b), ("bias", bias))},
            "alpha": operands["alpha"], "beta": operands["beta"],
            "epilogue": self.epilogue.name, "epilogue_args": list(self.epilogue.args),
            "epilogue_grid": self.epilogue.grid, "epilogue_config": self.epilogue.config}
        return head + "\n".join(self.lines) + "\n\n\n" + epilogue_source

    def _main_loop(self, a, b, rows: int, cols: int, depth: int, dtype) -> None:
        """The tile's indices and its float32 accumulator ``acc``."""
        pid = "tl.program_id(0)" + (".to(tl.int64)" if self.index_type == "tl.int64" else "")
        for text in (
                f"pid = {pid}",
                f"grid_m = ({rows} + XBLOCK - 1) // XBLOCK",
                f"grid_n = ({cols} + RBLOCK - 1) // RBLOCK",
                "width = GROUP_M * grid_n",
                "group = pid // width",
                "group_size = tl.minimum(grid_m - group * GROUP_M, GROUP_M)",
                "pid_m = group * GROUP_M + (pid % width) % group_size",
                "pid_n = (pid % width) // group_size",
                "rm = pid_m * XBLOCK + tl.arange(0, XBLOCK)",
                "rn = pid_n * RBLOCK + tl.arange(0, RBLOCK)",
                "acc = tl.zeros([XBLOCK, RBLOCK], tl.float32)",
                f"for k in range(0, {depth}, KBLOCK):"):
            self.line(text)
        self.indent += 1
        self.line("rk = k + tl.arange(0, KBLOCK)")
        a_ptr = _operand_index(a, "rm[:, None]", "rk[None, :]")
        b_ptr = _operand_index(b, "rk[:, None]", "rn[None, :]")
        self.line(f"a = tl.load(p_{a.name} + ({a_ptr}), (rm[:, None] < {rows}) & "
                  f"(rk[None, :] < {depth}), other=0.0)")
        self.line(f"b = tl.load(p_{b.name} + ({b_ptr}), (rk[:, None] < {depth}) & "
                  f"(rn[None, :] < {cols}), other=0.0)")
        precision = "tf32" if (dtype == torch.float32 and not self.interpret and
                               torch.backends.cuda.matmul.allow_tf32) else "ieee"
        extra = f", input_precision=\"{precision}\"" if dtype == torch.float32 else ""
        self.line(f"acc += tl.dot(a, b{extra})")
        self.indent -= 1
        self.loaded |= {a.name, b.name}

    def _matmul_value(self, bias, operands: dict, dtype, x, r) -> TritonValue:
        """The matmul's result at the tile, as the epilogue would load it: addmm's scaled
        bias added, rounded to the storage dtype."""
        acc = "acc"
        if operands["alpha"] != 1:
            self.line(f"acc = acc * {float(operands['alpha'])!r}")
        if bias is not None and operands["beta"] != 0:
            lay = bias.layout
            where = [flat_index(x, self.kernel.outer), r[0]][2 - len(lay.size):]
            term = self.load(bias.name, lay.index(where))
            scale = "" if operands["beta"] == 1 else f"{float(operands['beta'])!r} * "
            self.line(f"acc = acc + {scale}{term}")
        if dtype in HALF:
            self.line(f"acc_out = acc.to({TL_TYPES[dtype]}).to(tl.float32)")
            acc = "acc_out"
        return TritonValue(acc, dtype, frozenset({"x", "r"}))


def _operand_index(view, rows: str, cols: str) -> str:
    """Text of the element offset of a 2-D operand at (``rows``, ``cols``)."""
    lay = view.layout
    parts = [f"{rows} * {triton_index(lay.stride[0])}", f"{cols} * {triton_index(lay.stride[1])}"]
    if lay.offset != 0:
        parts.insert(0, triton_index(lay.offset))
    return " + ".join(parts)


def _ints(values) -> list[int]:
    return [int(v) for v in values]


__all__ = ["TritonMatmulKernel", "matmul_configs", "matmul_grid"]
