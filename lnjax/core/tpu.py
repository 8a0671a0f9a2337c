"""TPU slices as the compiler sees them on any host: the chips' published figures and the
topology's devices, from libtpu's compiler without a TPU attached (as MaxText's
train_compile does).

  slice_ = tpu.parse_topology("v5e:2x4")           # or "v5e-8", "v5p-8", "v6e:4x4", ...
  devices = tpu.topology_devices(slice_)            # 8 abstract "TPU v5 lite" devices
  slice_.chip.hbm_bytes, slice_.chip.peak_bf16_flops

Names: libtpu's `GENERATION:AxB[xC]` (chips along each axis of the slice's grid) or the
product name `GENERATION-N` (Cloud TPU's: N chips for v5e and v6e, N TensorCores, two a
chip, for v4 and v5p). libtpu itself (`libtpu==0.0.42.*`, the one `jax[tpu]==0.10.2`
pins) compiles; nothing here opens a TPU.
"""

import dataclasses
import glob
import importlib.util
import math
import os
import re
import sys

from lnjax.core import errors

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One chip's published peak figures (per chip, dense bf16 matmuls)."""

  generation: str  # v4 | v5e | v5p | v6e
  libtpu_name: str  # The generation's name in libtpu's topology strings.
  chip_config: str  # 'megacore' (two TensorCores as one device) or 'default'.
  axes: int  # Dimensions of the slice's chip grid (2: a plane, 3: a torus).
  cores_per_chip: int  # For product names: v4-8 and v5p-8 are 8 cores, 4 chips.
  peak_bf16_flops: float  # FLOP/s.
  hbm_bytes: int
  hbm_bandwidth: float  # Bytes/s.
  source: str
  platform: str = "tpu"  # tpu | cuda (lnjax/core/gpu_target.py).


# Published per-chip figures (pages read 2026-12-05). Bandwidths are 10^9 bytes/s; HBM
# sizes are taken as GiB: libtpu's compiler gives a v5e chip 15.75 GiB for a program's
# buffers, more than 16·10^9 bytes (its own out-of-memory message, 2026-12-05).
CHIPS = {
    "v4": Chip("v4", "v4", "megacore", 3, 2, 275e12, 32 * GiB, 1200e9,
               "https://cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM, "
               "1200 GBps)"),
    "v5e": Chip("v5e", "v5e", "default", 2, 1, 197e12, 16 * GiB, 819e9,
                "https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GB HBM, "
                "819 GBps)"),
    "v5p": Chip("v5p", "v5", "megacore", 3, 2, 459e12, 95 * GiB, 2765e9,
                "https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 95 GB HBM, "
                "2765 GBps)"),
    "v6e": Chip("v6e", "v6e", "default", 2, 1, 918e12, 32 * GiB, 1640e9,
                "https://cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 32 GB HBM, "
                "1640 GBps)"),
}
# NVIDIA GPUs, compiled for by XLA's CUDA plugin without a GPU (lnjax/core/gpu_target.py):
# `h100` (one) or `h100-N` (N on one host, NVLink). HBM: 80 GB as 10^9 bytes.
GPUS = {
    "h100": Chip("h100", "", "", 1, 1, 989e12, 80 * 10**9, 3.35e12,
                 "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 989 TFLOP/s "
                 "dense bf16, 1979 with sparsity; 80 GB HBM3; 3.35 TB/s)", platform="cuda"),
}
# The most chips one slice of a generation joins (a full pod, Cloud TPU's pages: v4 4096,
# v5e 256, v5p 8960, v6e 256), and the most for all slices together: past the largest
# published multislice job (50,944 TPU v5e chips, Google Cloud blog, November 2023).
# libtpu builds every device of the topology it is asked for before any check of its own
# (a million 2x2 slices took it 10.7 GB of host memory), so larger requests stop here.
POD_CHIPS = {"v4": 4096, "v5e": 256, "v5p": 8960, "v6e": 256}
MAX_CHIPS = 65536
# Product sizes offered (Cloud TPU's pages): chips per slice.
SIZES_2D = (1, 4, 8, 16, 32, 64, 128, 256)
SIZES_3D = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice (or `num_slices` of them joined by the data-center network)."""

  name: str  # As given.
  chip: Chip
  grid: tuple[int, ...]  # Chips along each axis of one slice.
  num_slices: int = 1

  @property
  def chips_per_slice(self) -> int:
    return math.prod(self.grid)

  @property
  def num_chips(self) -> int:
    return self.chips_per_slice * self.num_slices

  @property
  def product_name(self) -> str:
    """Cloud TPU's name of one slice: v5e-8, v5p-8 (cores), ..."""
    return f"{self.chip.generation}-{self.chips_per_slice * self.chip.cores_per_chip}"

  @property
  def libtpu_topology(self) -> str:
    return f"{self.chip.libtpu_name}:{'x'.join(map(str, self.grid))}"

  @property
  def chips_per_host_bounds(self) -> tuple[int, int, int]:
    """Four chips a host (2x2), fewer on a one-chip slice: Cloud TPU's hosts."""
    grid = tuple(self.grid) + (1,) * (3 - len(self.grid))
    return tuple(min(g, b) for g, b in zip(grid, (2, 2, 1)))

  @property
  def wrap(self) -> tuple[bool, bool, bool]:
    """Wrap-around links: a 3-D slice of 4+ chips a side is a torus; a 2-D one wraps
    along a full 16-chip axis (MaxText's accelerator_to_spec_map, the same choices)."""
    if self.chip.axes == 3:
      return (all(g >= 4 for g in self.grid),) * 3
    return tuple(g == 16 for g in self.grid) + (False,)


def known_names() -> str:
  """The accepted names, for an error line."""
  return ("GENERATION:AxB (v5e, v6e) or GENERATION:AxBxC (v4, v5p), e.g. v5e:2x4, "
          "v5p:2x2x1; or GENERATION-N, e.g. v5e-8, v5e-16, v5p-8, v6e-8, v4-8 "
          f"(generations: {', '.join(CHIPS)}); NVIDIA: h100, h100-8")


def parse_topology(name: str, num_slices: int = 1) -> Slice:
  """`name` -> a Slice; an unknown name is a ConfigError listing the valid forms."""
  errors.check_int("--num_slices", num_slices, 1)
  gpu = re.fullmatch(r"(h100)(?:-(\d+))?", str(name).strip().lower())
  if gpu:
    count = int(gpu.group(2) or 1)
    if count not in (1, 2, 4, 8) or num_slices != 1:
      raise errors.ConfigError(f"--topology={name!r}: h100, h100-2, h100-4 or h100-8 (one "
                               "host; --num_slices 1)")
    return Slice(name, GPUS[gpu.group(1)], (count,))
  m = re.fullmatch(r"(v\d+[a-z]?)(?::(\d+(?:x\d+){1,2})|-(\d+))", str(name).strip().lower())
  chip = CHIPS.get(m.group(1)) if m else None
  if chip is None:
    raise errors.ConfigError(f"--topology={name!r} is unknown: {known_names()}")
  if m.group(2):
    grid = tuple(int(g) for g in m.group(2).split("x"))
    if len(grid) != chip.axes:
      raise errors.ConfigError(f"--topology={name!r}: a {chip.generation} slice has "
                               f"{chip.axes} axes ({known_names()})")
    if min(grid) < 1:
      raise errors.ConfigError(f"--topology={name!r}: each axis needs one chip or more")
  else:
    grid = _product_grid(chip, int(m.group(3)), name)
  slice_ = Slice(name, chip, grid, num_slices)
  if slice_.chips_per_slice > POD_CHIPS[chip.generation]:
    raise errors.ConfigError(f"--topology={name!r}: {slice_.chips_per_slice} chips, more than "
                             f"a {chip.generation} pod's {POD_CHIPS[chip.generation]}")
  if slice_.num_chips > MAX_CHIPS:
    raise errors.ConfigError(f"--topology={name!r} --num_slices={num_slices}: "
                             f"{slice_.num_chips} chips, more than {MAX_CHIPS} (the largest "
                             "published multislice job had 50,944)")
  return slice_


def _product_grid(chip: Chip, n: int, name: str) -> tuple[int, ...]:
  """GENERATION-N -> the chip grid Cloud TPU gives it: doubling the last of the shortest
  axes from 1x1 (v5e-8 = 2x4, v5e-16 = 4x4) or 2x2x1 (v5p-16 = 2x2x2, v5p-32 = 2x2x4)."""
  chips, sizes = (n // chip.cores_per_chip, SIZES_3D if chip.axes == 3 else SIZES_2D)
  if n % chip.cores_per_chip or chips not in sizes:
    offered = ", ".join(f"{chip.generation}-{s * chip.cores_per_chip}" for s in sizes[:6])
    raise errors.ConfigError(f"--topology={name!r} is not a {chip.generation} slice size "
                             f"({offered}, ...)")
  grid = [2, 2, 1] if chip.axes == 3 else [1, 1]
  while math.prod(grid) < chips:
    shortest = min(grid)
    grid[max(i for i, g in enumerate(grid) if g == shortest)] *= 2
  return tuple(grid)


def topology_devices(slice_: Slice) -> list:
  """The slice's devices as libtpu's compiler describes them (no TPU needed), slice by
  slice. A libtpu that is missing or refuses the topology is one ConfigError line.
  NVIDIA GPUs: lnjax/core/gpu_target.py."""
  if slice_.chip.platform == "cuda":
    from lnjax.core import gpu_target
    return gpu_target.devices(slice_.chip, slice_.chips_per_slice)
  # Several processes may hold libtpu at once: this one only compiles, never opens a chip.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # No Cloud TPU metadata server to ask (libtpu would print three warnings): the compile
  # target is the topology below, whatever these say.
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", slice_.product_name)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  from jax.experimental import topologies  # (JAX loads libtpu here, not at import.)
  import importlib.util
  if importlib.util.find_spec("libtpu") is None:
    raise errors.ConfigError(f"--topology={slice_.name!r}: libtpu is not installed; install "
                             "it with pip install 'libtpu==0.0.42.*' (requirements.txt)")
  try:
    topology = topologies.get_topology_desc(
        topology_name=slice_.libtpu_topology, platform="tpu",
        chip_config_name=slice_.chip.chip_config,
        chips_per_host_bounds=slice_.chips_per_host_bounds, wrap=slice_.wrap,
        num_slices=slice_.num_slices)
  except Exception as e:  # libtpu's errors are RuntimeErrors of several kinds.
    lines = [l for l in str(e).splitlines() if l.strip()]
    raise errors.ConfigError(
        f"--topology={slice_.name!r}: libtpu cannot describe {slice_.libtpu_topology} "
        f"({lines[0] if lines else type(e).__name__})") from None
  return list(topology.devices)


GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips on a Cloud TPU VM's PCI bus (as jax looks for them).


def tpu_attached() -> bool:
  """A TPU chip on this host: a Google PCI device, or the accel/vfio devices TPU VMs have."""
  for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(vendor) as f:
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def cpu_unless_accelerated() -> bool:
  """JAX_PLATFORMS=cpu for a command on a host with libtpu installed (requirements.txt, for
  `lnjax compile`) but no TPU chip and no NVIDIA GPU: JAX would otherwise load libtpu (a
  200 MB library) at its first jax.devices() to find no TPU, and take libtpu's one-process
  lock file, which a second command at the same time then finds held. A JAX_PLATFORMS the
  user set (even empty) is left as it is. True when it set it."""
  if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
    return False
  if tpu_attached() or glob.glob("/dev/nvidia[0-9]*"):
    return False
  os.environ["JAX_PLATFORMS"] = "cpu"
  if "jax" in sys.modules:  # (Read at import: before any backend starts, this still holds.)
    sys.modules["jax"].config.update("jax_platforms", "cpu")
  return True
