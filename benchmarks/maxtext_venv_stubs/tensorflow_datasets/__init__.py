"""A stand-in for tensorflow_datasets, which MaxText's venv (benchmarks/maxtext_peer.sh)
lacks, so that lnjax's plans can be compiled there by MaxText's jax and libtpu: lnjax's
data builders subclass tfds classes at import, and a compile reads no data.

  PYTHONPATH=benchmarks/maxtext_venv_stubs ~/.cache/lnjax/maxtext_venv/bin/python \\
      benchmarks/tpu_plans.py --models=llama7b --slices=v5p-8 --meshes=fsdp ...

Anything asked of it is a class that accepts any arguments (and, given one function,
returns it: a decorator)."""


class _Meta(type):

  def __getattr__(cls, name):
    return _Any


class _Any(metaclass=_Meta):

  def __new__(cls, *args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
      return args[0]  # Used as a decorator.
    return object.__new__(cls)

  def __init__(self, *args, **kwargs):
    pass

  def __init_subclass__(cls, **kwargs):
    pass

  def __getattr__(self, name):
    return _Any()


core = _Any


def __getattr__(name):
  return _Any
