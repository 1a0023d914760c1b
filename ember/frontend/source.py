"""Sources: where a value the evaluator holds came from.

A Source renders two ways from one definition, which keeps guards and reconstruction
consistent (the TorchDynamo idea):

- ``expr()``: a Python expression valid inside the generated entry function, whose parameters
  are the frame's arguments (``x``), with ``___G`` the function's globals and ``___closure``
  its closure cells;
- ``name()``: the human-readable form used in logs and guard failure messages
  (``L['x']``, ``G['CONFIG'].flag``, ``L['self'].layers[0].weight``).

Attributes of ``nn.Module`` that live in ``_parameters``/``_buffers``/``_modules`` render as
direct dict reads (``m._modules['fc']``): ``Module.__getattr__`` is slow, and the entry
function walks these paths on every call.
"""
from __future__ import annotations

from dataclasses import dataclass


class Source:
    def expr(self) -> str:
        """The expression; sources with a parent build it with :meth:`render`."""
        return self.render(self.base.expr())

    def render(self, parent: str) -> str:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    @property
    def base(self) -> "Source | None":
        return None

    def is_under_module(self) -> bool:
        """True for values reached through an nn.Module's attributes (parameters, buffers)."""
        src = self
        while src is not None:
            if isinstance(src, ModuleDictSource):
                return True
            src = src.base
        return False

    def __str__(self):
        return self.name()


@dataclass(frozen=True)
class LocalSource(Source):
    local: str

    def expr(self):
        return self.local

    def name(self):
        return f"L[{self.local!r}]"


@dataclass(frozen=True)
class GlobalSource(Source):
    global_name: str

    def expr(self):
        return f"___G[{self.global_name!r}]"

    def name(self):
        return f"G[{self.global_name!r}]"


@dataclass(frozen=True)
class BuiltinSource(Source):
    builtin_name: str

    def expr(self):
        return f"___builtins[{self.builtin_name!r}]"

    def name(self):
        return f"B[{self.builtin_name!r}]"


@dataclass(frozen=True)
class ClosureCellSource(Source):
    """Contents of the compiled function's own closure cell ``index`` (free var ``var``)."""
    index: int
    var: str

    def expr(self):
        return f"___closure[{self.index}].cell_contents"

    def name(self):
        return f"C[{self.var!r}]"


@dataclass(frozen=True)
class AttrSource(Source):
    parent: Source
    attr: str

    @property
    def base(self):
        return self.parent

    def render(self, parent: str) -> str:
        if self.attr.isidentifier():
            return f"{parent}.{self.attr}"
        return f"getattr({parent}, {self.attr!r})"

    def name(self):
        return f"{self.parent.name()}.{self.attr}"


@dataclass(frozen=True)
class ModuleDictSource(Source):
    """``module.<attr>`` where attr lives in the module's ``_parameters``/``_buffers``/
    ``_modules`` dict: rendered as the direct dict read, named as the attribute."""
    parent: Source
    dict_name: str
    attr: str

    @property
    def base(self):
        return self.parent

    def render(self, parent: str) -> str:
        return f"{parent}.{self.dict_name}[{self.attr!r}]"

    def name(self):
        return f"{self.parent.name()}.{self.attr}"


@dataclass(frozen=True)
class GetItemSource(Source):
    parent: Source
    index: object   # int, str, or another hashable constant with a faithful repr

    @property
    def base(self):
        return self.parent

    def render(self, parent: str) -> str:
        return f"{parent}[{self.index!r}]"

    def name(self):
        return f"{self.parent.name()}[{self.index!r}]"


@dataclass(frozen=True)
class DefaultsSource(Source):
    """A default argument of a function: ``fn.__defaults__[i]`` or ``fn.__kwdefaults__[k]``."""
    parent: Source
    key: object
    kw: bool = False

    @property
    def base(self):
        return self.parent

    def render(self, parent: str) -> str:
        field = "__kwdefaults__" if self.kw else "__defaults__"
        return f"{parent}.{field}[{self.key!r}]"

    def name(self):
        field = "__kwdefaults__" if self.kw else "__defaults__"
        return f"{self.parent.name()}.{field}[{self.key!r}]"


@dataclass(frozen=True)
class FunctionClosureSource(Source):
    """Contents of closure cell ``index`` of a function reached through ``parent``."""
    parent: Source
    index: int

    @property
    def base(self):
        return self.parent

    def render(self, parent: str) -> str:
        return f"{parent}.__closure__[{self.index}].cell_contents"

    def name(self):
        return f"{self.parent.name()}.__closure__[{self.index}].cell_contents"


@dataclass(frozen=True)
class TensorMetaSource(Source):
    """``tensor.size()`` or ``tensor.stride()`` of a tensor input: the entry reads it once
    into a local that every shape guard and size argument indexes."""
    parent: Source
    method: str        # "size" or "stride"

    @property
    def base(self):
        return self.parent

    def render(self, parent: str) -> str:
        return f"{parent}.{self.method}()"

    def name(self):
        return f"{self.parent.name()}.{self.method}()"


@dataclass(frozen=True)
class ConstantSource(Source):
    """A value that the generated code holds directly (an object the entry keeps alive)."""
    slot: str

    def expr(self):
        return self.slot

    def name(self):
        return self.slot
