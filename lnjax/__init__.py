"""lnjax: where the normalization goes in a Transformer (Xiong et al., ICML 2020), in JAX/Flax."""

from lnjax import _malloc

# XLA:CPU allocates a large per-step scratch on worker threads; with glibc's default
# arenas and mmap thresholds that memory is mapped and unmapped every step (~30-40% of
# a small model's step time on CPU). Tuning glibc before any JAX work removes it.
_malloc.tune_glibc_malloc()

__version__ = "0.1.0"
