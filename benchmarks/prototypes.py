"""Prototypes of lnjax speed-ups, measured without editing lnjax: each one replaces an lnjax
piece at trace time (a subclass put in place of layers.Dense or norms.LayerNorm), so the
model, parameter tree and train_step stay lnjax's own. Prototypes that won (the attention
and cross-entropy custom VJPs) moved into lnjax; these are the ones that did not.

  # A/B: interleaved rounds of lnjax's train step, one compiled variant each
  # (--patch trim: glibc trimming off for the whole process, all variants)
  python benchmarks/prototypes.py compare base,dense_vjp,ln_vjp --rounds 8 --patch trim
  # gradients of each variant against lnjax's own (one step's grads, float32)
  python benchmarks/prototypes.py check dense_vjp,ln_vjp
  # the full benchmark (benchmarks/lm_step.py) with patches applied to lnjax's step
  python benchmarks/prototypes.py bench --patch ln,trim -- --steps 5 --rounds 8

Patches:
  dense  Dense with a custom VJP whose weight gradient multiplies a materialized xᵀ.
  ln     LayerNorm with a custom VJP (saves x̂ and 1/σ; closed-form backward).
  trim   glibc trimming off: mallopt(M_TRIM_THRESHOLD, -1) after lnjax's own settings.
"""

import os
import sys

import bench_env  # noqa: E402,F401  (first: lnjax on the path, malloc tuned before JAX)

import argparse  # noqa: E402
import ctypes  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import lm_step  # noqa: E402

from lnjax.core import losses  # noqa: E402
from lnjax import tasks  # noqa: E402
from lnjax.core import optim, sharding, state as state_lib, steps
from lnjax.models import ModelConfig, TransformerLM, layers, norms  # noqa: E402

ORIG = {"dense": layers.Dense, "ln": norms.LayerNorm}


# ---- dense: weight gradient from a materialized xᵀ (`compare base,dense_vjp`). ----------

@jax.custom_vjp
def _matmul(x_NxI, w_IxO):
  return x_NxI @ w_IxO


def _matmul_fwd(x, w):
  return x @ w, (x, w)


def _matmul_bwd(res, g):
  x, w = res
  barrier = jax.lax.optimization_barrier  # Keeps XLA from folding the transposes away.
  return g @ barrier(w.T), barrier(x.T) @ g


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


class DenseVJP(ORIG["dense"]):

  @nn.compact
  def __call__(self, x):
    d_in = x.shape[-1]
    w = layers.param(self, "kernel", self.kernel_init, (d_in, self.features), self.axes)
    y = _matmul(x.reshape(-1, d_in).astype(self.dtype), w.astype(self.dtype))
    if self.use_bias:
      y = y + layers.param(self, "bias", nn.initializers.zeros, (self.features,),
                           self.axes[1:]).astype(self.dtype)
    return y.reshape(*x.shape[:-1], self.features)


# ---- LayerNorm with a custom VJP. ------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layernorm(x, gamma, beta, eps):
  return _layernorm_fwd(x, gamma, beta, eps)[0]


def _layernorm_fwd(x, gamma, beta, eps):
  c = x - x.mean(-1, keepdims=True)
  rstd = jax.lax.rsqrt(jnp.mean(c * c, -1, keepdims=True) + eps)
  xhat = c * rstd
  return xhat * gamma + beta, (xhat, rstd, gamma)


def _layernorm_bwd(eps, res, g):
  xhat, rstd, gamma = res
  d = xhat.shape[-1]
  dgamma = jnp.sum((g * xhat).reshape(-1, d), 0)
  dbeta = jnp.sum(g.reshape(-1, d), 0)
  gg = g * gamma
  dx = rstd * (gg - gg.mean(-1, keepdims=True) - xhat * jnp.mean(gg * xhat, -1, keepdims=True))
  return dx, dgamma, dbeta


_layernorm.defvjp(_layernorm_fwd, _layernorm_bwd)


class LayerNormVJP(ORIG["ln"]):

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    gamma = layers.param(self, "scale", nn.initializers.ones, (d,), ("norm",))
    beta = layers.param(self, "bias", nn.initializers.zeros, (d,), ("norm",))
    return _layernorm(x.astype(jnp.float32), gamma, beta, self.eps).astype(self.dtype)


# ---- patching. -------------------------------------------------------------------------

PATCHES = ("dense", "ln", "trim")
VARIANTS = {"base": (), "dense_vjp": ("dense",), "ln_vjp": ("ln",), "dense_ln": ("dense", "ln")}


def apply(patches=()) -> None:
  """Puts the chosen replacements in place (and the originals back for the others)."""
  unknown = set(patches) - set(PATCHES)
  if unknown:
    raise ValueError(f"unknown patches {sorted(unknown)}; known: {PATCHES}")
  layers.Dense = DenseVJP if "dense" in patches else ORIG["dense"]
  norms.LayerNorm = LayerNormVJP if "ln" in patches else ORIG["ln"]
  if "trim" in patches:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if libc.mallopt(-1, -1) != 1:  # M_TRIM_THRESHOLD = -1: never trim.
      raise RuntimeError("mallopt(M_TRIM_THRESHOLD, -1) failed")


def _cfg(norm):
  return ModelConfig(vocab_size=4096, num_layers=8, d_model=128, num_heads=4, d_ff=512,
                     max_len=128, norm_position=norm, dropout_rate=0.0)


def build_step(variant: str, norm: str = "pre"):
  """[compiled lnjax train_step, state, batch] with `variant`'s patches in effect."""
  apply(VARIANTS[variant])
  try:
    setup = state_lib.make_setup(_cfg(norm), optim.OptConfig(name="adam", learning_rate=1e-3),
                                 num_steps=1000, task=tasks.get("lm"))
    mesh = sharding.make_mesh(sharding.MeshConfig(data=1), jax.devices()[:1])
    state = state_lib.init_state(setup, mesh, seed=0)
    shard = state_lib.state_shardings(setup, mesh)
    step = jax.jit(functools.partial(steps.train_step, setup=setup, label_smoothing=0.0, seed=0),
                   in_shardings=(shard, sharding.batch_sharding(mesh)),
                   out_shardings=(shard, sharding.replicated(mesh)), donate_argnums=0)
    tokens = np.random.default_rng(0).integers(0, 4096, (32, 129), dtype=np.int32)
    batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:]),
             "weights": jnp.ones((32, 128), jnp.float32)}
    compiled = step.lower(state, batch).compile()
  finally:
    apply(())
  return [compiled, state, batch]


def run_steps(v, n):
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    v[1], metrics = v[0](v[1], v[2])
    jax.block_until_ready((v[1], metrics))
    times.append(time.perf_counter() - t0)
  return times, float(metrics["train_loss"])


def compare(variants, rounds, steps, norm):
  built = {n: build_step(n, norm) for n in variants}
  for n in variants:
    print(f"{n}: XLA temp {built[n][0].memory_analysis().temp_size_in_bytes / 2**20:.0f} MiB")
    run_steps(built[n], 4)
  times, loss = {n: [] for n in variants}, {}
  for r in range(rounds):
    for n in variants:
      t, loss[n] = run_steps(built[n], steps)
      times[n] += t
    print(f"round {r + 1}/{rounds} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
        f"{n} {1e3 * np.median(times[n][-steps:]):.0f}" for n in variants), flush=True)
  base = np.median(times[variants[0]])
  for n in variants:
    a = np.asarray(times[n]) * 1e3
    print(f"{n:16s} median {np.median(a):6.1f} ms  min {a.min():6.1f} ms  "
          f"{100 * (np.median(a) / 1e3 / base - 1):+5.1f}% vs {variants[0]}  loss {loss[n]:.4f}")


def check(variants, norm):
  """Max relative gradient error of each variant against lnjax's own, per leaf."""
  from flax.traverse_util import flatten_dict  # noqa: PLC0415
  cfg = _cfg(norm)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 4096, (32, 129), dtype=np.int32))
  params = nn.unbox(TransformerLM(cfg).init(jax.random.key(0), tokens[:1, :-1])["params"])

  def grads(variant):
    apply(VARIANTS[variant])
    try:
      model = TransformerLM(cfg)

      def loss(p):
        logits = model.apply({"params": p}, tokens[:, :-1])
        return losses.cross_entropy(logits, tokens[:, 1:], jnp.ones((32, 128)), 0.1)[0] / 4096

      return flatten_dict(jax.jit(jax.grad(loss))(params))
    finally:
      apply(())

  ref = grads("base")
  ok = True
  for n in variants:
    g = grads(n)
    # The key bias's true gradient is 0 (softmax is shift-invariant): skip its noise.
    errs = {"/".join(k): float(jnp.abs(g[k] - ref[k]).max() / (jnp.abs(ref[k]).max() + 1e-12))
            for k in ref if k[-2:] != ("key", "bias")}
    worst = max(errs, key=errs.get)
    ok &= errs[worst] < 1e-4
    print(f"{n}: max relative gradient error {errs[worst]:.2e} ({worst})")
  return ok


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("mode", choices=("compare", "check", "bench"))
  p.add_argument("variants", nargs="?", default="base,dense_vjp,ln_vjp")
  p.add_argument("--rounds", type=int, default=8)
  p.add_argument("--steps", type=int, default=4)
  p.add_argument("--norm", choices=("pre", "post"), default="pre")
  p.add_argument("--patch", default="", help="bench: comma-separated patches")
  args, rest = p.parse_known_args()
  if args.mode == "compare":
    if "trim" in args.patch.split(","):
      apply(("trim",))  # Process-wide; the layer patches are per variant.
    compare(args.variants.split(","), args.rounds, args.steps, args.norm)
  elif args.mode == "check":
    sys.exit(0 if check(args.variants.split(","), args.norm) else 1)
  else:
    patches = tuple(x for x in args.patch.split(",") if x)
    apply(patches)  # Left in place: lm_step traces lnjax's step with them.
    print(f"lnjax with prototype patches: {patches or 'none'}", flush=True)
    sys.exit(lm_step.main([a for a in rest if a != "--"]))


if __name__ == "__main__":
  main()
