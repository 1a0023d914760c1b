"""Test modules are imported by basename (no packages under tests/): two files with the same
name stop pytest from collecting the whole suite. This names them instead."""
import collections
import pathlib


def test_test_module_basenames_are_unique():
    root = pathlib.Path(__file__).parent
    by_name = collections.defaultdict(list)
    for path in root.rglob("*.py"):
        by_name[path.name].append(str(path.relative_to(root)))
    clashes = {name: paths for name, paths in by_name.items()
               if len(paths) > 1 and name != "conftest.py"}
    assert not clashes, f"test files with the same basename: {clashes}"
