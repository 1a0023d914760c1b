"""Layout of ``ember/frontend/variables/`` (issue 30): one module per concept, no import cycles
between its modules beyond a short allowlist, and no reaching for another module's private
(underscore) names.

Imports are read with ``ast``, at module level and inside functions alike; those under
``if TYPE_CHECKING:`` never run and are left out.
"""
import ast
import pathlib
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "ember.frontend.variables"
PACKAGE_DIR = ROOT / "ember" / "frontend" / "variables"

# (importer, imported): the only imports allowed to close a cycle. Each must sit inside a
# function (a module-level one would make the import order matter), with a comment there.
ALLOWED_BACK_EDGES = {
    ("containers", "attribute_lookup"):
        "a namedtuple's methods are user functions, whose calls bind *args into tuples",
    ("dicts", "attribute_lookup"):
        "a dict subclass's methods are user functions, whose calls bind **kwargs into dicts",
    ("tensor", "numpy"):
        "x.numpy() makes an ndarray tracker, and an ndarray tracker wraps a tensor tracker",
}


@dataclass(frozen=True)
class Import:
    target: str                 # the sibling module imported from
    names: tuple                # names taken from it (empty for ``import``-ing the module)
    line: int
    in_function: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _sibling(module: str | None, level: int, name: str | None = None) -> str | None:
    """The sibling module an import refers to, or None when it is outside the package."""
    if level:
        if level != 1:
            return None
        dotted = f"{PACKAGE}.{module}" if module else PACKAGE
    else:
        dotted = module or ""
    if name is not None and dotted == PACKAGE:
        dotted = f"{PACKAGE}.{name}"        # from ember.frontend.variables import tensor
    if not dotted.startswith(PACKAGE + "."):
        return None
    return dotted[len(PACKAGE) + 1:].split(".")[0]


def sibling_imports(source: str) -> tuple[list[Import], dict[str, str]]:
    """The imports of sibling modules in ``source``, and the local names bound to sibling
    modules themselves (``from ember.frontend.variables import tensor as t``: t -> tensor)."""
    found: list[Import] = []
    module_aliases: dict[str, str] = {}

    def visit(node, in_function: bool):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.ImportFrom):
            whole = _sibling(node.module, node.level)
            if whole is not None:
                found.append(Import(whole, tuple(a.name for a in node.names), node.lineno,
                                    in_function))
            else:
                for a in node.names:
                    target = _sibling(node.module, node.level, a.name)
                    if target is not None:
                        found.append(Import(target, (), node.lineno, in_function))
                        module_aliases[a.asname or a.name] = target
        elif isinstance(node, ast.Import):
            for a in node.names:
                target = _sibling(a.name, 0)
                if target is not None:
                    found.append(Import(target, (), node.lineno, in_function))
                    if a.asname:
                        module_aliases[a.asname] = target
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), False)
    return found, module_aliases


def private_uses(source: str, own: str) -> list[str]:
    """``from sibling import _name`` and ``sibling._name`` in a module named ``own``."""
    imports, aliases = sibling_imports(source)
    bad = [f"line {i.line}: from {i.target} import {n}" for i in imports if i.target != own
           for n in i.names if n.startswith("_") and not n.startswith("__")]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                aliases.get(node.value.id, own) != own and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            bad.append(f"line {node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return bad


def import_graph(sources: dict[str, str]) -> dict[tuple[str, str], list[Import]]:
    edges: dict[tuple[str, str], list[Import]] = {}
    for name, source in sources.items():
        for imp in sibling_imports(source)[0]:
            if imp.target != name and imp.target in sources:
                edges.setdefault((name, imp.target), []).append(imp)
    return edges


def find_cycle(edges) -> list[str] | None:
    """One cycle of the directed graph ``edges`` as a path [a, b, ..., a], or None."""
    succ: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        succ.setdefault(a, []).append(b)
    state: dict[str, int] = {}      # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(v):
        state[v] = 1
        path.append(v)
        for w in succ.get(v, ()):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                cycle = dfs(w)
                if cycle:
                    return cycle
        path.pop()
        state[v] = 2
        return None

    for v in sorted(succ):
        if v not in state:
            cycle = dfs(v)
            if cycle:
                return cycle
    return None


def _package_sources() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(PACKAGE_DIR.glob("*.py"))}


def test_no_import_cycles_beyond_the_allowlist():
    edges = import_graph(_package_sources())
    assert ("builder", "base") in edges     # the scanner sees the package's imports
    rest = {e for e in edges if e not in ALLOWED_BACK_EDGES}
    cycle = find_cycle(rest)
    assert cycle is None, (
        "import cycle between modules of ember/frontend/variables: " + " -> ".join(cycle)
        + "\nmove the shared helper to the module owning its concept, or pass a callable in; "
        "a genuinely two-way dependency goes into ALLOWED_BACK_EDGES with its reason")


def _reaches(edges, start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        if v == goal:
            return True
        if v not in seen:
            seen.add(v)
            todo += [b for a, b in edges if a == v]
    return False


def test_allowed_back_edges_are_function_level_commented_and_needed():
    sources = _package_sources()
    edges = import_graph(sources)
    for (a, b), reason in ALLOWED_BACK_EDGES.items():
        assert reason
        assert (a, b) in edges, f"{a} no longer imports {b}: drop it from ALLOWED_BACK_EDGES"
        assert _reaches(set(edges) - {(a, b)}, b, a), \
            f"{b} no longer leads back to {a}: import it at module level, drop the allowlist entry"
        lines = sources[a].splitlines()
        for imp in edges[(a, b)]:
            assert imp.in_function, \
                f"{a}.py:{imp.line} imports {b} at module level: keep it in a function"
            assert lines[imp.line - 2].strip().startswith("#"), \
                f"{a}.py:{imp.line}: say why {b} is imported here in a comment above"


def test_no_private_names_across_modules():
    bad = []
    for name, source in _package_sources().items():
        bad += [f"variables/{name}.py {use}" for use in private_uses(source, name)]
    for path in (ROOT / "ember").rglob("*.py"):     # nor from outside the package
        if path.parent != PACKAGE_DIR:
            bad += [f"{path.relative_to(ROOT)} {use}"
                    for use in private_uses(path.read_text(), "<outside>")]
    assert not bad, "private names used across variable modules (make them public):\n" + \
        "\n".join(bad)


def test_scanner_self_check():
    sources = {
        "a": "from ember.frontend.variables.b import B\n",
        "b": "def f():\n    from ember.frontend.variables.c import _helper\n",
        "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
             "    from ember.frontend.variables.b import B\n"
             "from ember.frontend.variables import a as mod_a\nx = mod_a._private\n",
    }
    edges = import_graph(sources)
    assert set(edges) == {("a", "b"), ("b", "c"), ("c", "a")}
    assert [i.in_function for i in edges[("b", "c")]] == [True]
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"), ("b", "c")}) is None
    assert private_uses(sources["b"], "b") == ["line 2: from c import _helper"]
    assert private_uses(sources["c"], "c") == ["line 5: a._private"]
    assert private_uses("from . import tensor\nfrom .base import _x\n", "t") == [
        "line 2: from base import _x"]
