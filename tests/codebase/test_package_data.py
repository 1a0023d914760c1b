"""Files of the ember package that are not Python (the C++ prelude) ship in the wheel:
pyproject.toml's package-data names each, or an installed Ember could not read it."""
import fnmatch
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_non_python_file_is_package_data():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"].get(
        "package-data", {})
    unlisted = []
    for path in (ROOT / "ember").rglob("*"):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        if not any(fnmatch.fnmatch(path.name, g) for g in globs.get(package, [])):
            unlisted.append(str(path.relative_to(ROOT)))
    assert not unlisted, f"not in pyproject.toml's [tool.setuptools.package-data]: {unlisted}"
    assert (ROOT / "ember/backend/targets/cpp/prelude.h").is_file()
