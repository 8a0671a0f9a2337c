"""What every benchmark script does first, before JAX starts.

`import bench_env` (the scripts' own folder is on sys.path when run as
`python benchmarks/NAME.py`) makes lnjax importable from a checkout that was not
`pip install -e`'d (a device machine's copy of the tree) and applies lnjax's glibc
malloc settings for XLA:CPU (lnjax/core/allocator.py), which must precede JAX's first
allocation.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
  sys.path.insert(1, REPO)

from lnjax.core import allocator  # noqa: E402

allocator.tune_glibc_malloc()
