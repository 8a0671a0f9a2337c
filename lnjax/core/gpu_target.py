"""NVIDIA GPUs as XLA's CUDA plugin describes them without a GPU: `lnjax compile
--topology=h100-8` compiles a run's steps for 8 H100s on any host (BUILD.md, "Compiling
for GPUs without one").

XLA's GPU plugin creates a compile-only topology from two options (its
PJRT_GpuDeviceTopology_Create, openxla/xla xla/pjrt/c/pjrt_c_api_gpu_internal.cc):
`topology`, "partitions x hosts x devices a host", and `target_config`, the GPU's
description as a text GpuTargetConfigProto (XLA ships such specs for hlo-opt under
xla/backends/gpu/target_config/specs/). Without `target_config` it asks the CUDA driver,
which a CPU host does not have ("No visible GPU devices"). Needs the CUDA plugin's two
wheels at the pinned JAX, without their CUDA libraries (the compile needs none):

  pip install --no-deps 'jax-cuda13-plugin==0.10.2' 'jax-cuda13-pjrt==0.10.2'

XLA:GPU keeps no cost analysis of a compiled program (None): the plan counts the FLOPs
and bytes of the program before XLA's GPU passes (jax's Lowered.cost_analysis).
"""

import os

from lnjax.core import errors

# An H100 SXM (80 GB HBM3) as XLA's deviceless compiler needs it: its figures from
# NVIDIA's data sheet (132 SMs, 1.98 GHz boost, 50 MB L2, 3.35 TB/s, compute
# capability 9.0) and the CUDA limits of that compute capability.
H100_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024  threads_per_warp: 32
  shared_memory_per_block: 49152  shared_memory_per_core: 233472
  shared_memory_per_block_optin: 232448  threads_per_core_limit: 2048
  core_count: 132  fpus_per_core: 128
  block_dim_limit_x: 2147483647  block_dim_limit_y: 65535  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000  l2_cache_size: 52428800  clock_rate_ghz: 1.98
  device_memory_size: 84942979072
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
TARGET_CONFIGS = {"h100": H100_TARGET_CONFIG}


def devices(chip, count: int) -> list:
  """`count` compile-only devices of `chip` on one host; a missing plugin or a refused
  description is one ConfigError line."""
  # The plugin checks its CUDA libraries' versions when it starts: none are needed to
  # compile, and a CPU host has none.
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  from jax.experimental import topologies
  try:
    topology = topologies.get_topology_desc(platform="cuda", topology=f"1x1x{count}",
                                            target_config=TARGET_CONFIGS[chip.generation])
  except Exception as e:  # NotImplementedError without the plugin; XLA's runtime errors.
    lines = [l for l in str(e).splitlines() if l.strip()]
    raise errors.ConfigError(
        f"--topology={chip.generation}-{count}: XLA's CUDA plugin cannot describe it "
        f"({lines[0] if lines else type(e).__name__}); install it with pip install "
        "--no-deps 'jax-cuda13-plugin==0.10.2' 'jax-cuda13-pjrt==0.10.2'") from None
  return list(topology.devices)
