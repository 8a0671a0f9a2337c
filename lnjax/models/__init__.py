"""Norms, the placement of norms, layers and the Transformer models built from them."""

from lnjax.models.config import SEQUENCE_WINDOW, ModelConfig
from lnjax.models.placement import NORM_POSITIONS, OWN_QK_NORM
from lnjax.models.transformer import (Block, Decoder, Encoder, EncoderDecoder, TransformerLM,
                                      count_params, init_params)
