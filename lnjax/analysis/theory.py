"""The paper's simplified setting at initialization (Xiong et al. 2020, §3.2).

One attention head with W_Q = W_K = 0 (every token attends uniformly:
Att(x)_i = (1/n) Σ_j x_j W_V), FFN(x) = ReLU(x W¹) W², every weight d×d Xavier-uniform
(variance 1/d), LayerNorm without gain or bias, inputs x_1 ~ N(0, I_d) per token:

  Post-LN:  a = x_l + Att(x_l);  b = LN(a);  c = b + FFN(b);  x_{l+1} = LN(c)
            Lemma 1: E‖c‖² = 3/2·d   (the vector before each layer's last LN)
  Pre-LN:   a = x_l + Att(LN(x_l));  x_{l+1} = a + FFN(LN(a))
            Lemma 2: (1 + l/2)·d ≤ E‖x_{l+1}‖² ≤ (1 + 3l/2)·d
"""

import jax
import jax.numpy as jnp


def main_path_norms(seed: int, d: int, n: int, num_layers: int) -> dict:
  """‖·‖²/d, averaged over tokens, after each layer: Post-LN's c and Pre-LN's x_{l+1}."""
  xavier = jax.nn.initializers.xavier_uniform()
  ln = lambda v: (v - v.mean(-1, keepdims=True)) / jnp.sqrt(v.var(-1, keepdims=True) + 1e-6)
  sq = lambda v: float(jnp.mean(jnp.sum(v * v, -1)) / d)
  keys = jax.random.split(jax.random.key(seed), 3 * num_layers + 1)
  x1 = jax.random.normal(keys[0], (n, d))
  weights = [[xavier(k, (d, d)) for k in keys[1 + 3 * i:4 + 3 * i]] for i in range(num_layers)]
  att = lambda v, w_v: jnp.broadcast_to(v.mean(0, keepdims=True), v.shape) @ w_v
  ffn = lambda v, w1, w2: jax.nn.relu(v @ w1) @ w2

  post, pre = [], []
  x_post = x_pre = x1
  for w_v, w1, w2 in weights:
    b = ln(x_post + att(x_post, w_v))
    c = b + ffn(b, w1, w2)  # x_{l+1} = LN(c)
    post.append(sq(c))
    x_post = ln(c)
    a = x_pre + att(ln(x_pre), w_v)
    x_pre = a + ffn(ln(a), w1, w2)
    pre.append(sq(x_pre))
  return {"post": post, "pre": pre}
