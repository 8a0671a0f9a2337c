"""The device mesh and the logical-axis rules that place parameters and batches on it.

Three mesh axes (MaxText's conventions): 'data' (batch only), 'fsdp' (batch and the
parameters' and optimizer state's 'embed' axis), 'model' (heads, FFN and vocabulary:
tensor parallelism). By default every device is on 'data'. Parameters name their axes
logically (lnjax/models/layers.py); `LOGICAL_RULES` maps those names onto mesh axes.

Activations inside the models name theirs too ('batch', 'length', 'embed', 'heads',
'kv', 'mlp', 'vocab': `constrain`), as MaxText's layers do: inside `activations_on(mesh)`
(the jitted steps of lnjax/core/build.py) each is constrained to the mesh axes the same
rules give it, the batch over (data, fsdp) first, so that an activation's 'embed' axis
is never on 'fsdp' (the rules give a mesh axis to one dimension only). Without them,
XLA's propagation from the FSDP-sharded weights replicated the activations over the
batch: the 125M LM on 8 v5e chips needed 50 GiB a chip under fsdp=8 against 12 GiB
under data=8 (BENCHMARKS.md, "TPU plans"). Outside that context, and on a mesh of one
device, `constrain` returns its input: no operation is added.

Across slices (TPU multislice) or hosts joined by a slower network, each axis is
`dcn_<axis>` granules long times `<axis>` devices within a granule (the Flax lm1b
example's dcn/ici split): data=-1 with dcn_data=2 is data parallelism over two slices,
and within each over all its devices.
"""

import contextlib
import dataclasses
import math
import threading

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from lnjax.core import errors

MESH_AXES = ("data", "fsdp", "model")

LOGICAL_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("heads", "model"),
    ("mlp", "model"),
    ("vocab", "model"),
    ("norm", None),
    ("length", None),  # (Activations only: a sequence's positions, and a head's width.)
    ("kv", None),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Devices per axis within a granule (ICI), and granules per axis (DCN)."""

  data: int = -1  # Devices on the data-parallel axis; -1 = all the others of a granule.
  fsdp: int = 1  # Devices sharding parameters and optimizer state (FSDP).
  model: int = 1  # Devices sharding heads and FFN (tensor parallel).
  # Across TPU slices (or hosts, elsewhere): each axis is dcn_<axis> × <axis> devices
  # long, the data/fsdp/model sizes above then counting devices within one slice.
  dcn_data: int = 1  # Slices on the data axis (multislice data parallelism).
  dcn_fsdp: int = 1  # Slices on the fsdp axis (parameters sharded across slices too).
  dcn_model: int = 1  # Slices on the model axis (seldom: tensor parallelism is chatty).

  def __post_init__(self):
    for key in MESH_AXES:
      value = getattr(self, key)
      ok = isinstance(value, int) and not isinstance(value, bool) and (
          value == -1 or 1 <= value <= errors.INT64_MAX)
      if not ok:
        raise errors.ConfigError(f"mesh.{key}={value!r} must be a positive integer (at most "
                                 "2^63 - 1) or -1")
    if [getattr(self, k) for k in MESH_AXES].count(-1) > 1:
      raise errors.ConfigError("mesh: at most one of data, fsdp, model may be -1")
    for key in MESH_AXES:
      errors.check_int(f"mesh.dcn_{key}", getattr(self, f"dcn_{key}"), 1)

  @property
  def dcn_shape(self) -> tuple[int, int, int]:
    return tuple(getattr(self, f"dcn_{k}") for k in MESH_AXES)

  def shape(self, num_devices: int) -> tuple[int, int, int]:
    """The axes' sizes within one granule of `num_devices` devices."""
    sizes = [getattr(self, k) for k in MESH_AXES]
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise errors.ConfigError(
            f"mesh: {num_devices} devices do not divide into fsdp×model={known}")
      sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) > num_devices:
      raise errors.ConfigError(
          f"mesh: data×fsdp×model={math.prod(sizes)} exceeds the {num_devices} devices present")
    return tuple(sizes)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
  """A (data, fsdp, model) mesh over `devices` (default: all), with Auto axis types so
  that jit propagates the shardings we give it (classic logical-axis sharding).

  One granule: the devices in jax's topology-aware order (mesh_utils), or the first
  ones when fewer are asked for than present (said in one line on stdout, with the run's
  other start-up lines, when `devices` is the default, all of them: the others idle
  through the run; stderr stays for errors). Several: each axis is dcn × ici long,
  granules outermost, so that only the dcn part of an axis crosses the slow network.
  """
  everything = devices is None
  devices = list(jax.devices() if devices is None else devices)
  granules = math.prod(cfg.dcn_shape)
  if granules == 1:
    shape = cfg.shape(len(devices))
    n = math.prod(shape)
    if n < len(devices):
      grid = np.asarray(devices[:n]).reshape(shape)
      if everything and jax.process_index() == 0:
        print(f"Mesh: {n} of the {len(devices)} devices used (data×fsdp×model = "
              f"{'×'.join(map(str, shape))}); the other {len(devices) - n} stay idle "
              "(mesh.data=-1 uses them all).", flush=True)
    else:
      grid = _topology_mesh(mesh_utils.create_device_mesh, shape, devices)
  else:
    if len(devices) % granules:
      raise errors.ConfigError(f"mesh: {len(devices)} devices do not split into "
                               f"dcn_data×dcn_fsdp×dcn_model={granules} granules")
    shape = cfg.shape(len(devices) // granules)
    # TPU slices know their slice_index; elsewhere (GPU hosts, CPU processes) a
    # process is the unit of the slower network.
    by_process = len({getattr(d, "slice_index", 0) for d in devices}) != granules
    grid = _topology_mesh(mesh_utils.create_hybrid_device_mesh, shape, cfg.dcn_shape,
                          devices, process_is_granule=by_process)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def _topology_mesh(create, *args, **kwargs) -> np.ndarray:
  """mesh_utils' topology-aware grid; where an axis is not a product of whole physical axes
  (fsdp=8, model=2 on v5e-16's 4×4 chips), one with physical axes split between mesh
  axes, as MaxText's `allow_split_physical_axes` gives."""
  try:
    return create(*args, **kwargs)
  except (ValueError, NotImplementedError):
    pass
  try:
    return create(*args, **kwargs, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError) as e:
    raise errors.ConfigError(f"mesh: {e}") from None


def logical_shardings(logical_specs, shapes, mesh: Mesh):
  """Logical PartitionSpecs (from nn.get_partition_spec) -> NamedShardings.

  An axis whose size the mesh axes do not divide (a character vocabulary of 67 over
  model=2, say) is replicated rather than refused.
  """
  named = nn.logical_to_mesh_sharding(logical_specs, mesh, LOGICAL_RULES)
  return jax.tree.map(lambda sh, x: _divisible(sh, x.shape, mesh), named, shapes)


def _divisible(sh: NamedSharding, shape, mesh: Mesh) -> NamedSharding:
  spec = []
  for dim, axes in zip(shape, tuple(sh.spec) + (None,) * (len(shape) - len(sh.spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    ways = math.prod(mesh.shape[a] for a in names)
    spec.append(axes if dim % ways == 0 else None)
  return NamedSharding(mesh, P(*spec))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """[B, ...] arrays split over the batch axes, replicated over 'model'."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: dict, sharding: NamedSharding) -> dict:
  """This process's rows of the batch -> global jax.Arrays (one process or many)."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


_ACTIVATIONS = threading.local()  # .mesh: the mesh `constrain` places activations on.


@contextlib.contextmanager
def activations_on(mesh: Mesh):
  """Inside (while a step is traced), `constrain` places activations on `mesh`."""
  before = getattr(_ACTIVATIONS, "mesh", None)
  _ACTIVATIONS.mesh = mesh
  try:
    yield
  finally:
    _ACTIVATIONS.mesh = before


def constrain(x, axes):
  """`x` (an array, or a tuple of arrays alike: ResiDual's two streams) constrained to the
  mesh axes its logical `axes` map to under LOGICAL_RULES (jax.lax.with_sharding_constraint),
  a dimension the mesh axes do not divide replicated; `x` itself outside `activations_on`
  or on a mesh of one device."""
  mesh = getattr(_ACTIVATIONS, "mesh", None)
  if mesh is None or mesh.size == 1:
    return x
  spec = nn.logical_to_mesh_axes(tuple(axes), LOGICAL_RULES)
  return jax.tree.map(lambda y: jax.lax.with_sharding_constraint(
      y, _divisible(NamedSharding(mesh, spec), y.shape, mesh)), x)
