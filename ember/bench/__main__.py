"""``python -m ember.bench [options]``: the same as ``ember bench [options]``."""
import sys

from ember.bench.cli import bench_main

sys.exit(bench_main(sys.argv[1:], prog="python -m ember.bench"))
