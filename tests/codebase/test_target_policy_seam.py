"""Target policy is asked of the ``Target``; ``device.type`` is compared only where a module
models what eager does on a device (issue 30).

A new ``device.type ==`` check in the compiler fails here: ask the target instead
(``ember/backend/targets/__init__.py``'s hooks), or, if the check models eager's own
per-device behaviour, add the module below with its reason.
"""
import pathlib
import re

EMBER = pathlib.Path(__file__).resolve().parents[2] / "ember"

# module (or folder) -> why it may look at the device type
ALLOWED = {
    "backend/targets/": "the targets themselves: where policy lives",
    "backend/codegen/wrapper.py": "the wrapper places buffers on their device",
    "backend/runtime/": "run-time helpers: CUDA graphs replay only CUDA tensors",
    "fake.py": "fake tensors follow eager's device rules (CPU scalars, cuda:None -> index)",
    "fake_fixups.py": "meta answers corrected to what eager's CPU kernels return",
    "decomp/__init__.py": "eager keeps var/std statistics in float64 on the CPU only",
    "aot/rng.py": "eager draws from the CPU generator or the device module's",
    "bench/": "the benchmark harness synchronises and sizes inputs per device",
}

DEVICE_TYPE_TEST = re.compile(r"\.type\s*[!=]=|\.type\s+(not\s+)?in\s")


def _allowed(rel: str) -> bool:
    return any(rel == key or (key.endswith("/") and rel.startswith(key)) for key in ALLOWED)


def test_device_type_checks_only_where_allowed():
    offenders = []
    for path in sorted(EMBER.rglob("*.py")):
        rel = path.relative_to(EMBER).as_posix()
        if _allowed(rel):
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if "device" in code and DEVICE_TYPE_TEST.search(code):
                offenders.append(f"ember/{rel}:{lineno}: {line.strip()}")
    assert not offenders, "device.type checks outside the target seam:\n" + "\n".join(offenders)


def test_allowed_entries_exist():
    # the list only names modules that exist, so it cannot silently outlive a move
    for key in ALLOWED:
        assert (EMBER / key.rstrip("/")).exists(), key
