"""No import cycles between Ember's modules, but those listed in ``ALLOWED`` (issue 30); and
the frontend imports no compiler stage (``FRONTEND_MUST_NOT_IMPORT``).

The graph: one node per module of ``ember/`` (a package is its ``__init__``), one edge per
import statement, at module level or inside a function (both run, sooner or later), relative
imports resolved. ``from P import name`` is an edge to ``P.name`` when that is a module, else to
``P``; ``import a.b.c`` is an edge to ``a.b.c`` alone (the parent packages Python initialises
on the way are not edges: a package importing its own submodules would otherwise be a cycle
with each of them). Imports under ``if TYPE_CHECKING:`` never run and are left out, and so are
``importlib.import_module`` calls (names in strings).

A cycle is a strongly connected component of more than one module. Each allowed one is listed
with exactly its modules and the reason it is tolerated; the test fails on any other, and on
an allowed one that is no longer there as listed (it was broken up or changed: update the
entry, so the list only shrinks).
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "ember"

# frozenset of the cycle's modules -> why it is allowed for now
ALLOWED: dict[frozenset[str], str] = {
    frozenset({
        "ember.frontend.variables.attribute_lookup", "ember.frontend.variables.builtins",
        "ember.frontend.variables.containers", "ember.frontend.variables.dicts",
        "ember.frontend.variables.functions", "ember.frontend.variables.modules",
        "ember.frontend.variables.numpy", "ember.frontend.variables.scalars",
        "ember.frontend.variables.tensor", "ember.frontend.variables.user_defined",
    }): "three function-level back-edges, each commented at its import: methods of user "
        "subclasses of list/dict are user functions (containers/dicts -> attribute_lookup), "
        "and x.numpy() wraps a tensor tracker in an ndarray one (tensor -> numpy); "
        "tests/codebase/test_variables_layout.py keeps the list to those",
    frozenset({"ember.backend.targets", "ember.backend.targets.cpp.target",
               "ember.backend.targets.triton.target"}):
        "the targets package imports its built-in targets at its end so they register; each "
        "subclasses the package's Target",
    frozenset({"ember.backend.compile", "ember.backend.pipeline"}):
        "the training stage calls compile.compile_aten through the module, at each call, "
        "so tests can replace it",
    frozenset({"ember.frontend.analysis", "ember.frontend.bytecode"}):
        "bytecode.py imports analysis.stack_depth inside a function (analysis imports "
        "bytecode at module level); frontend, not yet de-cycled (issue 30)",
    frozenset({"ember.frontend.opcodes_control", "ember.frontend.opcodes_data",
               "ember.frontend.translator"}):
        "the opcode handler modules register into translator.HANDLERS, and translator.py "
        "imports them at its end to fill the table; frontend, not yet de-cycled (issue 30)",
}


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, anywhere, but under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from _imports(node)


def _imported_modules(name: str, path: pathlib.Path, modules: set[str]) -> set[str]:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in modules:   # `import ember.x.attr`? -> ember.x
                    target = target.rpartition(".")[0]
                if target:
                    found.add(target)
            continue
        if node.level:
            base = package[:len(package) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module
        for alias in node.names:
            if f"{source}.{alias.name}" in modules:
                found.add(f"{source}.{alias.name}")
            elif source in modules:
                found.add(source)
    found.discard(name)
    return found


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {name: _imported_modules(name, path, set(paths)) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def example_cycle(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """A shortest import chain from the component's first module back to itself."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for succ in sorted(graph[node] & component):
                if succ == start:
                    return paths[node] + [start]
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    nxt.append(succ)
        frontier = nxt
    return [start]


def test_no_import_cycles_but_the_allowed_ones():
    graph = import_graph()
    found = set(cycles(graph))
    new = [c for c in found if c not in ALLOWED]
    gone = [c for c in ALLOWED if c not in found]
    problems = [f"import cycle not allowed: {' -> '.join(example_cycle(graph, c))} (modules: "
                f"{', '.join(sorted(c))})" for c in new]
    problems += [f"allowed cycle no longer there as listed, update ALLOWED: "
                 f"{', '.join(sorted(c))}" for c in gone]
    assert not problems, "\n".join(problems)


def test_every_allowed_cycle_says_why():
    for component, reason in ALLOWED.items():
        assert len(component) > 1 and isinstance(reason, str) and reason.strip(), component


def test_the_graph_sees_relative_function_level_and_package_imports(tmp_path):
    pkg = tmp_path / "ember"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from ember import a\n",
        "a.py": "def f():\n    from .sub import b\n",               # function level, relative
        "sub/__init__.py": "",
        "sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ember.c\n"
                    "else:\n    from .. import c\n",                 # TYPE_CHECKING skipped
        "c.py": "import ember.a\nimport torch\n",                    # closes a -> b -> c -> a
        "d.py": "from ember.sub import b\nfrom ember import a as _\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph == {"ember": {"ember.a"}, "ember.a": {"ember.sub.b"}, "ember.sub": set(),
                     "ember.sub.b": {"ember.c"}, "ember.c": {"ember.a"},
                     "ember.d": {"ember.sub.b", "ember.a"}}
    assert cycles(graph) == [frozenset({"ember.a", "ember.sub.b", "ember.c"})]
    assert example_cycle(graph, cycles(graph)[0]) == ["ember.a", "ember.sub.b", "ember.c",
                                                      "ember.a"]


# the frontend hands graphs to whatever backend it is given (DESIGN.md §2): it imports no
# compiler stage, nor the API that names the backends
FRONTEND_MUST_NOT_IMPORT = ("ember.aot", "ember.backend", "ember.backend_registry",
                            "ember.api", "ember.bench", "ember.decomp")


def test_the_frontend_imports_no_compiler_stage():
    graph = import_graph()
    bad = [f"{module} imports {imported}"
           for module, imports in sorted(graph.items()) if module.startswith("ember.frontend")
           for imported in sorted(imports)
           if any(imported == p or imported.startswith(p + ".") for p in FRONTEND_MUST_NOT_IMPORT)]
    assert not bad, "\n".join(bad)
