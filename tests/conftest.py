"""Test set-up: 8 virtual CPU devices (for the sharding tests) and a shared cache dir.

XLA_FLAGS must be set before JAX is first imported, hence here.
"""

import os
import sys
import tempfile

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  # (pytest-xdist's workers inherit the flag from the controller: add it once.)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Prepared data sets and tokenizers are cached once per test session.
os.environ.setdefault("LNJAX_CACHE_DIR", tempfile.mkdtemp(prefix="lnjax_test_cache_"))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)
