"""Mutations of Python state made by the captured code, replayed after the graph runs.

The evaluator never touches real Python objects. Mutations of values that exist outside the
frame (attributes of objects and modules, lists/dicts/sets the frame received, closure cells,
globals) are recorded here and turned into plain Python statements in the entry function,
after the graph has produced the values they store. Objects created during capture need no
replay; they are rebuilt only if they escape.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ember.frontend.exc import Unsupported

if TYPE_CHECKING:
    from ember.frontend.variables.base import VariableTracker


class SideEffects:
    def __init__(self):
        self.attr_stores: dict[int, tuple["VariableTracker", dict[str, "VariableTracker"]]] = {}
        self.mutated: dict[int, "VariableTracker"] = {}   # sourced containers changed in place
        self.cell_stores: dict[int, tuple[object, "VariableTracker"]] = {}
        self.global_stores: dict[str, "VariableTracker"] = {}
        self.new_objects: list["VariableTracker"] = []

    def __bool__(self):
        return bool(self.attr_stores or self.mutated or self.cell_stores or self.global_stores)

    # -- recording ---------------------------------------------------------------------------
    def store_attr(self, obj: "VariableTracker", name: str, value: "VariableTracker") -> None:
        if obj.source is None:
            raise Unsupported(f"setting attribute {name!r} on an object without a source")
        self.attr_stores.setdefault(id(obj), (obj, {}))[1][name] = value

    def pending_attr(self, obj: "VariableTracker", name: str) -> "VariableTracker | None":
        entry = self.attr_stores.get(id(obj))
        return entry[1].get(name) if entry else None

    def mutate(self, container: "VariableTracker") -> None:
        if container.source is not None:
            self.mutated[id(container)] = container

    def store_cell(self, cell, value: "VariableTracker") -> None:
        self.cell_stores[id(cell)] = (cell, value)

    def store_global(self, name: str, value: "VariableTracker") -> None:
        self.global_stores[name] = value

    def track_new_object(self, obj: "VariableTracker") -> None:
        self.new_objects.append(obj)

    def mutated_objects(self) -> list["VariableTracker"]:
        """Trackers of pre-existing objects the code changed (containers, attribute owners)."""
        return [*self.mutated.values(), *(obj for obj, _ in self.attr_stores.values())]

    # -- replay ------------------------------------------------------------------------------
    def codegen(self, cg) -> list[str]:
        """Statements that apply the mutations; values are computed first, then stored, so
        a swap (``a.x, a.y = a.y, a.x``) replays correctly."""
        values: list[str] = []
        stores: list[str] = []

        def value_of(vt):
            name = cg.fresh("___se")
            values.append(f"{name} = {cg.reconstruct(vt)}")
            return name

        for obj, attrs in self.attr_stores.values():
            target = cg.load(obj.source)
            for attr, vt in attrs.items():
                stores.append(f"setattr({target}, {attr!r}, {value_of(vt)})")
        for container in self.mutated.values():
            replay = getattr(container, "replay_mutation", None)
            if replay is None:
                raise Unsupported(f"replaying a mutation of {container}")
            stores.append(replay(cg.load(container.source), value_of))
        from ember.frontend.variables.functions import EMPTY_CELL
        for cell, vt in self.cell_stores.values():
            if vt is EMPTY_CELL:
                stores.append(f"del {cg.reconstruct(cell)}.cell_contents")
            else:
                stores.append(f"{cg.reconstruct(cell)}.cell_contents = {value_of(vt)}")
        for name, vt in self.global_stores.items():
            stores.append(f"___G[{name!r}] = {value_of(vt)}")
        return values + stores

