"""Measurements on a model at initialization or from a checkpoint (Xiong et al. 2020, §3)."""

from lnjax.analysis.jacobian import spectral_norm

__all__ = ["spectral_norm"]
