"""The wrapper: a generated Python module whose ``call(args)`` runs one compiled graph.

It allocates the buffers kernels write, calls the kernels (each target prints its own launch
lines: ctypes calls with data pointers for C++, grid launches for Triton) and the ATen calls
(library kernels and fallbacks) in order, frees each buffer after its last use, and returns
the outputs. The module is plain Python a user can read:
``EMBER_LOGS=output_code`` prints it with the kernels' C++, ``EMBER_DEBUG_DIR`` dumps it.
"""
from __future__ import annotations

import math

import sympy
import torch

from ember import logs
from ember.backend.ir import (Buffer, ComputedBuffer, ExternBuffer, FloorDiv,
                              ModIndex, ReinterpretView)
from ember.backend.scheduler import FusionGroup, _extern_reads
from ember.backend.sizevars import size_hint


# Library ops called through torch's direct Python bindings (same arguments as the ATen
# schema): an OpOverload call goes through the boxed dispatcher path, 7 us more per
# convolution and 2 us more per addmm here, paid on every call of the compiled graph.
DIRECT_BINDINGS = {torch.ops.aten.convolution.default: torch.convolution,
                   torch.ops.aten.addmm.default: torch.addmm,
                   torch.ops.aten.mm.default: torch.mm,
                   torch.ops.aten.bmm.default: torch.bmm,
                   torch.ops.aten.baddbmm.default: torch.baddbmm}


# library calls whose ``out=`` form writes its result where it is told (convolution's
# ``out=`` copies a result it allocated)
WRITES_OUT = (torch.ops.aten.addmm.default, torch.ops.aten.mm.default,
              torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default)


def size_text(value) -> str:
    """Python for a size: the number, or the expression over the size symbols (each bound
    to a local of its name: ``SizeInput``)."""
    if isinstance(value, sympy.Basic) and not value.is_Integer:
        from ember.shapes import to_python
        from ember.shapes.functions import FloorDiv as PyFloorDiv, Mod as PyMod
        expr = value.replace(FloorDiv, PyFloorDiv).replace(ModIndex, PyMod)
        return to_python(expr, lambda s: s.name)
    return str(int(value))


def _tuple(values) -> str:
    parts = [size_text(v) for v in values]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _numel_key(n):
    """A storage size as a pool key: an int, or the expression."""
    return int(n) if n.is_Integer else n


# ``call`` makes no Python-level call on its common path, only calls of C functions and
# methods: a Python callee's frame may not fit the interpreter's current frame-stack chunk
# (``call`` has hundreds of locals), and then every such call maps a fresh 16 KB chunk and
# unmaps it on return (convnext_tiny: 150 mmap/munmap pairs and their page faults per call,
# 5 ms of 50, depending on where the frame happened to start)
def _as_strided(name: str, size, stride, offset) -> str:
    """A view of ``name``'s memory, ``offset`` elements from its data pointer."""
    start = f"{name}.storage_offset()" + (f" + {size_text(offset)}" if offset != 0 else "")
    return f"as_strided({name}, {_tuple(size)}, {_tuple(stride)}, {start})"


def _with_layout(name: str, lay, maybe_none: bool = False, library: bool = False) -> str:
    """``name`` (an ATen result) rebound to a copy in ``lay`` when ATen chose another layout
    (``runtime.with_layout``), checked inline. ``maybe_none``: an output of a multi-output
    call, which ATen's kernel may leave undefined (None) where its meta kernel gives a
    tensor (``_native_multi_head_attention``'s weights when not asked for). The dtype is
    checked too, but not a library call's (``library``: matmuls, convolutions, attention,
    whose C++ meta kernels give the dtype; 70 ns a check, on every call): a fallback's meta
    kernel may disagree with its real one (``_FIXUPS`` in ember/fake.py), and kernels read
    memory as the dtype they were generated for."""
    size, stride = _tuple(lay.size), _tuple(lay.stride)
    check = f"{name}.stride() != {stride} or {name}.shape != {size}"
    dtype = ""
    if not library:
        check += f" or {name}.dtype != {lay.dtype}"
        dtype = f", {lay.dtype}"
    if maybe_none:
        check = f"{name} is not None and ({check})"
    return f"if {check}: {name} = with_layout({name}, {size}, {stride}{dtype})"


# ``call`` with kept buffers: the kept ones when no other call holds them, else its own
_KEPT_ENTRY = ["_slots = _kept if _lock.acquire(False) else _new_slots()", "try:"]
_KEPT_EXIT = ["finally:", "    if _slots is _kept:", "        _lock.release()"]
_KEPT_ENTRY_SIZED = ["_slots = _kept if _lock.acquire(False) else []", "try:"]


class WrapperCodegen:
    def __init__(self, graph, steps, kernels: dict[int, "object"]):
        self.graph = graph
        self.steps = steps
        self.kernels = kernels       # id(FusionGroup) -> codegen.common.Kernel
        self.lines: list[str] = []
        self.consts: dict[str, object] = {}
        # name -> layout of the tensor the name is bound to, where the wrapper made it so
        # (allocated, or an ATen result through with_layout); not inputs or aliases
        self.layouts: dict[str, object] = {}
        # allocations of the buffers kept between calls (``_kept_slot``), in slot order
        self.slots: list[str] = []
        self.slot_symbols: set[str] = set()    # size symbols the kept buffers' sizes read
        self.kept_bytes = 0

    def _same_layout(self, name: str, lay) -> bool:
        """Name ``name`` is bound to a tensor with ``lay``'s size and strides at offset 0: a
        view of it in that layout is the tensor itself (no ``as_strided`` per graph call)."""
        old = self.layouts.get(name)
        return old is not None and lay.offset == 0 and \
            _tuple(old.size) == _tuple(lay.size) and _tuple(old.stride) == _tuple(lay.stride)

    def ref(self, node, output: bool = False) -> str:
        """Python expression for an IR argument of an ATen call or (``output``) a returned
        value; an output view stays a tensor of its own, as eager's would be."""
        if isinstance(node, ReinterpretView):
            lay = node.layout
            if not output and self._same_layout(node.data.name, lay):
                return node.data.name
            return _as_strided(node.data.name, lay.size, lay.stride, lay.offset)
        if isinstance(node, Buffer):
            return node.name
        if isinstance(node, (list, tuple)):
            inner = ", ".join(self.ref(x, output) for x in node)
            return f"[{inner}]" if isinstance(node, list) else f"({inner}{',' if len(node) == 1 else ''})"
        if isinstance(node, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return self.const(node)
        if isinstance(node, sympy.Basic):
            return size_text(node)
        if isinstance(node, float) and not math.isfinite(node):
            return self.const(node)   # inf/nan have no literal
        return repr(node)

    def const(self, obj) -> str:
        name = f"_c{len(self.consts)}"
        self.consts[name] = obj
        return name

    def generate(self) -> str:
        from ember import config
        g = self.graph
        names = [b.name for b in g.inputs]
        # an input has the layout its kernels were compiled for (the caller's guards): a view
        # of all of it, as a library call's argument, is the input itself
        self.layouts.update({b.name: b.layout for b in g.inputs
                             if getattr(b.layout, "stride", None) is not None})
        out = ["import torch", "import math", "from ember.backend.runtime import with_layout",
               "empty_strided = torch.empty_strided", "as_strided = torch.as_strided",
               *(["_kernel_range = torch.profiler.record_function"]
                 if config.profile_kernels else []), "", "", "def call(args):"]
        body: list[str] = []
        if names:
            # the list is the caller's to give away (``call_boxed``): emptied, so each input
            # is freed at its last use below, as eager's autograd frees saved tensors
            body.append(f"{', '.join(names)}, = args")
            body.append("args.clear()")
        last_use = self._last_uses()
        returned = self._returned_names()
        output_names = returned | set(names)
        self.read_by_fallback = {name for step in self.steps
                                 if isinstance(step, ExternBuffer) and not step.is_library
                                 for name in _extern_reads(step)}
        poolable = self._poolable(output_names)
        self.keepable = self._keepable(output_names)
        self.shaped = self._allocation_layouts(output_names)
        self.kept_names: set[str] = set()     # names bound to kept memory
        read = {name for step in self.steps for name in (
            self.kernels[id(step)].args if isinstance(step, FusionGroup) else _extern_reads(step))}
        pool: dict[tuple, list[str]] = {}      # (dtype, elements) -> dead buffers, by age
        pending: dict[str, int] = {}           # pooled name -> where its ``del`` would go
        for i, step in enumerate(self.steps):
            if isinstance(step, FusionGroup):
                kernel = self.kernels[id(step)]
                aliases = []
                for node in step.nodes:
                    if node.buf.reuses and node.name not in step.local:
                        aliases.append(f"{node.name} = {node.buf.reuses}")
                        self.layouts.pop(node.name, None)
                        if node.buf.reuses in self.kept_names:
                            self.kept_names.add(node.name)
                    if node.name in step.local or node.writes != node.name:
                        continue
                    body.append(self._allocate(node.buf, pool, pending, output_names))
                # a value stored in place of a dead buffer is named before the launch: the
                # kernel may read it back under its own name
                body.extend(aliases)
                launch = kernel.call_lines({a: a for a in kernel.args})
                if config.profile_kernels:
                    body.append(f"with _kernel_range({kernel.name!r}):")
                    launch = ["    " + line for line in launch]
                body.extend(launch)
            else:
                body.extend(self._extern(step, step.name in read or step.name in output_names,
                                         (pool, pending, output_names)))
            dead = sorted(n for n, last in last_use.items()
                          if last == i and n not in returned)
            for name in [n for n in dead if n in poolable]:
                pool.setdefault(poolable[name], []).append(name)
                pending[name] = len(body)
                body.append("")
            dead = [n for n in dead if n not in poolable]
            if dead:
                body.append(f"del {', '.join(dead)}")
        for name, at in pending.items():   # never reused: freed where it died
            body[at] = f"del {name}"
        body = [line for line in body if line]
        outputs = [self.ref(o, output=True) for o in g.outputs]
        body.append(f"return ({', '.join(outputs)}{',' if len(outputs) == 1 else ''})")
        if self.slots:
            logs.log("output_code", "wrapper keeps %d buffers (%.1f MB) between calls",
                     len(self.slots), self.kept_bytes / 2 ** 20)
            params = ", ".join(sorted(self.slot_symbols))
            out[-1:] = self._kept_slots_header(params)
            if not params:
                body = ["if not _slots:", "    _slots += _new_slots()", *body]
                entry = _KEPT_ENTRY
            else:    # kept at the sizes of the latest call (after the inputs are bound)
                entry = _KEPT_ENTRY_SIZED
                body = [*body[:2], f"if _slots is not _kept or _kept_sizes[0] != ({params},):",
                        f"    _slots[:] = _new_slots({params})",
                        "    if _slots is _kept:",
                        f"        _kept_sizes[0] = ({params},)", *body[2:]]
            body = [*entry, *["    " + line for line in body], *_KEPT_EXIT]
        out += ["    " + line for line in body]
        return "\n".join(out) + "\n"

    def _kept_slots_header(self, params: str) -> list[str]:
        """Module lines that hold the kept buffers (of sizes over the symbols ``params``),
        and ``call``'s first line."""
        return ["import threading", "", "_kept = []    # filled by the first call",
                "_kept_sizes = [None]    # the symbols' values _kept was made for",
                "_lock = threading.Lock()", "", "",
                f"def _new_slots({params}):",
                "    with torch.inference_mode(False):   # normal tensors: writable in any mode",
                "        return [", *(f"            {alloc}," for alloc in self.slots),
                "        ]", "", "",
                "def call(args):"]

    def _keepable(self, output_names: set[str]) -> set[str]:
        """Buffers whose memory may be kept between calls: CPU buffers (of a symbolic size:
        kept at the latest call's sizes, made again when they change), written by a
        generated kernel or a library call, whose memory never reaches a
        result or a fallback ATen call (whose result may be a view of it), under their own
        name or a later one that takes the memory over in place (``reuses``)."""
        taken_by = {node.buf.reuses: node.name for step in self.steps
                    if isinstance(step, FusionGroup) for node in step.nodes if node.buf.reuses}
        keep = set()
        for buf in self._given_memory(takers=False):
            if torch.device(buf.layout.device).type != "cpu":
                continue
            name, chain = buf.name, set()
            while name is not None and name not in chain:
                chain.add(name)
                name = taken_by.get(name)
            if not chain & (output_names | self.read_by_fallback):
                keep.add(buf.name)
        return keep

    def _allocation_layouts(self, output_names: set[str]) -> dict[str, object]:
        """Buffers a generated kernel writes that the wrapper may allocate in another shape:
        kernels see only the data pointer, so a buffer that library calls read only through
        views (a [B, T, C] activation that matmuls read as [B*T, C]) is allocated as the
        view of all its memory read most, and those calls take it as it is (an
        ``as_strided`` less per call and reader). Not outputs, nor memory that another
        buffer takes over in place."""
        views: dict[str, dict] = {}      # name -> {(size, stride, offset): [layout, reads]}
        whole: set[str] = set(output_names)

        def visit(a):
            if isinstance(a, ReinterpretView) and isinstance(a.data, Buffer):
                lay = a.layout
                key = (_tuple(lay.size), _tuple(lay.stride), size_text(lay.offset))
                views.setdefault(a.data.name, {}).setdefault(key, [lay, 0])[1] += 1
            elif isinstance(a, Buffer):
                whole.add(a.name)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
        written, in_place = {}, set()
        for step in self.steps:
            if isinstance(step, FusionGroup):
                for node in step.nodes:
                    if node.buf.reuses:
                        in_place |= {node.name, node.buf.reuses}
                    elif node.name not in step.local and node.writes == node.name:
                        written[node.name] = node.buf.layout
            else:
                visit(step.args)
                visit(list(step.kwargs.values()))
        for o in self.graph.outputs:
            if isinstance(o, ReinterpretView):
                whole.add(o.data.name)
        shaped = {}
        for name, own in written.items():
            seen = views.get(name)
            if name in whole or name in in_place or not seen:
                continue
            whole_views = [(reads, lay) for lay, reads in seen.values()
                           if lay.offset == 0 and lay.dtype == own.dtype and
                           sympy.simplify(lay.storage_numel() - own.storage_numel()) == 0]
            if whole_views:
                shaped[name] = max(whole_views, key=lambda v: v[0])[1]
        return shaped

    def _given_memory(self, takers: bool) -> list[Buffer]:
        """The buffers the wrapper gives memory: written by a generated kernel into their
        own memory (``takers``: or into memory they took over in place) or by a library call
        (mm, convolution, ...)."""
        buffers = []
        for step in self.steps:
            if isinstance(step, FusionGroup):
                buffers += [node.buf for node in step.nodes if node.name not in step.local and (
                    node.writes == node.name or takers and node.buf.reuses)]
            elif step.is_library and step.parent is None and step.layout is not None:
                buffers.append(step)
        return buffers

    def _kept_slot(self, buf: Buffer, lay) -> str | None:
        """``_slots[i]`` for a buffer kept between calls (``_keepable``), allocated in layout
        ``lay``, or None, while the kept bytes stay within ``config.kept_buffers_mb``. A
        call that finds the kept buffers in use (the same graph running in another thread,
        or re-entered) allocates its own."""
        from ember import config
        if config.kept_buffers_mb < 0:
            raise ValueError(f"config.kept_buffers_mb={config.kept_buffers_mb}: expected a "
                             f"number of MB, 0 or more")
        if buf.name not in self.keepable:
            return None
        nbytes = size_hint(lay.storage_numel()) * lay.dtype.itemsize   # (at the sizes seen)
        if self.kept_bytes + nbytes > config.kept_buffers_mb * 2 ** 20:
            return None
        self.kept_bytes += nbytes
        self.slot_symbols |= {s.name for e in (*lay.size, *lay.stride)
                              for s in sympy.sympify(e).free_symbols}
        self.kept_names.add(buf.name)
        self.slots.append(f"empty_strided({_tuple(lay.size)}, {_tuple(lay.stride)}, "
                          f"dtype={self.const(lay.dtype)}, device={self.const(lay.device)})")
        return f"_slots[{len(self.slots) - 1}]"

    def _allocate(self, buf: ComputedBuffer, pool: dict, pending: dict,
                  output_names: set[str]) -> str:
        """The line that gives ``buf`` memory: ``_memory_for``'s, else new memory."""
        lay = self.shaped.get(buf.name, buf.layout)
        self.layouts[buf.name] = lay
        got = self._memory_for(buf, pool, pending, output_names, lay)
        if got is None:
            return (f"{buf.name} = empty_strided({_tuple(lay.size)}, {_tuple(lay.stride)}, "
                    f"dtype={self.const(lay.dtype)}, device={self.const(lay.device)})")
        memory, dead = got
        return f"{buf.name} = {memory}; del {dead}  # reuse" if dead else \
            f"{buf.name} = {memory}  # kept"

    def _memory_for(self, buf: Buffer, pool: dict, pending: dict, output_names: set[str],
                    lay=None) -> tuple[str, str | None] | None:
        """Memory for ``buf`` that costs no allocator call: (a dead buffer of the same dtype
        and size, in layout ``lay`` (default ``buf``'s), and that buffer's name), else (a
        buffer kept between calls, None), else None."""
        lay = buf.layout if lay is None else lay
        free = pool.get((lay.dtype, _numel_key(lay.storage_numel())), [])
        # kept memory goes only to buffers whose memory may be kept too
        usable = [] if buf.name in output_names else free if buf.name in self.keepable \
            else [name for name in free if name not in self.kept_names]
        if usable:
            # the most recently dead: one that died long ago would have been held all that
            # time (ATen's outputs die into the pool and never leave it, so with the oldest
            # first a 12-layer ViT held 23 activations; the unused ones die where they died)
            old = usable[-1]
            free.remove(old)
            del pending[old]
            if old in self.kept_names:
                self.kept_names.add(buf.name)
            if self._same_layout(old, lay):
                return old, old
            return _as_strided(old, lay.size, lay.stride, 0), old
        slot = self._kept_slot(buf, lay)
        return None if slot is None else (slot, None)

    def _poolable(self, output_names: set[str]) -> dict[str, tuple]:
        """Buffers whose memory a later buffer may take once they are dead: not returned,
        written by a generated kernel (into their own memory, or into memory they took
        over in place) or a library call (mm, convolution, ...), and never read by a
        fallback ATen call (whose result may alias its arguments)."""
        # memory a later buffer of the same kernel took over (``reuses``) lives on in it
        taken = {node.buf.reuses for step in self.steps if isinstance(step, FusionGroup)
                 for node in step.nodes}
        # (a symbolic size: the memory of a buffer whose size is the same expression)
        return {buf.name: (buf.layout.dtype, _numel_key(buf.layout.storage_numel()))
                for buf in self._given_memory(takers=True)
                if buf.name not in output_names and buf.name not in self.read_by_fallback
                and buf.name not in taken}

    def _extern(self, buf: ExternBuffer, used: bool = True, memory: tuple = ()) -> list[str]:
        """The ATen call (or the pick of one output of a multi-output call); a result that
        is read is given the layout the kernels were generated for (``runtime.with_layout``).
        A matrix product writes (``out=``) into memory ``_memory_for(buf, *memory)`` finds
        for it."""
        if buf.parent is not None:
            path = "".join(f"[{i}]" for i in buf.result_index)
            lines = [f"{buf.name} = {buf.parent.name}{path}"]
            if used:
                lay = buf.layout
                self.layouts[buf.name] = lay
                lines.append(_with_layout(buf.name, lay, maybe_none=True,
                                          library=buf.parent.is_library))
            return lines
        args = [self.ref(a) for a in buf.args]
        kwargs = [f"{k}={self.ref(v)}" for k, v in buf.kwargs.items()]
        dead = None
        # (CPU only: CUDA's caching allocator makes a result's memory cheap)
        if memory and buf.kernel in WRITES_OUT and buf.layout is not None and not buf.kwargs \
                and torch.device(buf.layout.device).type == "cpu":
            got = self._memory_for(buf, *memory)
            if got is not None:
                kwargs.append(f"out={got[0]}")
                dead = got[1]
        target = self.const(DIRECT_BINDINGS.get(buf.kernel, buf.kernel))
        lines = [f"{buf.name} = {target}({', '.join(args + kwargs)})  # {buf.kernel}"]
        if dead:
            lines.append(f"del {dead}  # reuse")
        if buf.layout is not None:
            lay = buf.layout
            self.layouts[buf.name] = lay
            lines.append(_with_layout(buf.name, lay, library=buf.is_library))
        return lines

    def _returned_names(self) -> set[str]:
        names = set()
        for o in self.graph.outputs:
            if isinstance(o, ReinterpretView):
                names.add(o.data.name)
            elif isinstance(o, Buffer):
                names.add(o.name)
        return names

    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            if isinstance(step, FusionGroup):
                kernel = self.kernels[id(step)]
                for a in kernel.args:
                    last[a] = i
            else:
                last[step.name] = i
                for name in _extern_reads(step):
                    last[name] = i
        inputs = {b.name for b in self.graph.inputs}
        # constants are the module's globals, never deleted
        return {k: v for k, v in last.items()
                if k in inputs or not k.startswith(("arg", "const"))}
