"""DESIGN.md §4: Ember re-implements torch's compiler and must not import it."""
import ast
import pathlib

FORBIDDEN = ("torch._dynamo", "torch._inductor", "torch._functorch", "torch.export",
             "torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes",
             "torch.fx.experimental.sym_node", "torch.fx.experimental.proxy_tensor",
             "torch._C._dynamo")
ROOT = pathlib.Path(__file__).resolve().parents[2] / "ember"
ALLOWED_DIRS = {"bench"}   # the benchmark harness compares against torch.compile as a peer


def _violations(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            parts = []
            cur = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                parts.append(cur.id)
                dotted = ".".join(reversed(parts))
                names = [dotted]
                if dotted == "torch.compile":
                    yield node.lineno, dotted
        for name in names:
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                yield node.lineno, name


def test_no_forbidden_imports():
    bad = []
    for path in ROOT.rglob("*.py"):
        if ALLOWED_DIRS & set(path.relative_to(ROOT).parts[:-1]):
            continue
        bad += [f"{path.relative_to(ROOT.parent)}:{line}: {name}"
                for line, name in _violations(path)]
    assert not bad, "Ember must not use these parts of torch (DESIGN.md §4):\n" + "\n".join(bad)


def test_scanner_catches_a_forbidden_import(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("import torch._dynamo\nfrom torch.fx.experimental.proxy_tensor import make_fx\n"
                 "y = torch.compile(f)\n")
    assert [n for _, n in _violations(p)] == [
        "torch._dynamo", "torch.fx.experimental.proxy_tensor",
        "torch.fx.experimental.proxy_tensor.make_fx", "torch.compile"]
