"""What every benchmark script does first, before JAX starts.

`import bench_env` (the scripts' own folder is on sys.path when run as
`python benchmarks/NAME.py`) makes lnjax importable from a checkout that was not
`pip install -e`'d (a device machine's copy of the tree) and applies lnjax's glibc
malloc settings for XLA:CPU (lnjax/core/allocator.py), which must precede JAX's first
allocation (where JAX has not started yet: a test that imports a script leaves it).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
  sys.path.insert(1, REPO)

from lnjax.core import allocator  # noqa: E402

if "jax" not in sys.modules:  # (Too late where JAX has started: a test importing a script.)
  allocator.tune_glibc_malloc()


def share_the_gpu() -> None:
  """For a script whose own process and its children use one GPU together (suite.py's
  JAX and PyTorch workers, gpu_check.py's training run): JAX allocates on demand instead
  of taking 75% of the GPU's memory at its first call. Call it before JAX's first use.

  On the first GPU run (an H200, 2026-12-04) suite.py's parent, which only times a matmul,
  held that 75%; its JAX worker could not get its 45% (XLA logged failed allocations from
  62.9 GiB down to 37.2 GiB) and the PyTorch worker ran out of memory moving its model."""
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
