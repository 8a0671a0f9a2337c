"""lnjax: where the normalization goes in a Transformer (Xiong et al., ICML 2020), in JAX/Flax.

Importing lnjax changes nothing in the process: the entry points (lnjax.main, lnjax.analyze,
...) tune glibc's allocator for XLA:CPU themselves (lnjax/allocator.py).
"""

__version__ = "0.1.0"
