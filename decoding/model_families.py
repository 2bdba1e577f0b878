"""The seq2seq model families the static decoder and the packed encoder implement: M2M100 (NLLB, the demo
model), Marian and MBart, what differs between them, and the helpers both build their fused layers with.

Both modules take the weights of a loaded Hugging Face model (as CTranslate2's converters do); the families
differ only around the layers (:class:`Family`, read from the Hugging Face model):

==========  ===================================================  ==============  ==========  ===========
family      positions                                            embedding norm  layers      final norm
==========  ===================================================  ==============  ==========  ===========
M2M100      sinusoidal, offset ``padding_idx + 1``; a pad token   no              pre-norm    yes
            gets the zero row ``padding_idx`` (HF's own builder)
Marian      sinusoidal table ``embed_positions.weight``, offset 0  no              post-norm   no
MBart       learned ``embed_positions.weight``, offset 2          yes             pre-norm    yes
==========  ===================================================  ==============  ==========  ===========

Embeddings are scaled by the family's ``embed_scale`` (``scale_embedding``); Marian's and MBart's
``final_logits_bias`` is the output bias, which the adapter hands to the projection (not applied here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# A loaded Hugging Face model or one of its modules: read by attribute name (config, layers, projections),
# which ``nn.Module``'s typing cannot follow.
HFModule = Any


# Hugging Face model types the engine implements, by family.
FAMILIES = {"m2m_100": "m2m100", "marian": "marian", "mbart": "mbart"}


def unsupported_reason(model: HFModule) -> str | None:
    """None when :class:`StaticDecoder` can run ``model``; otherwise why not (for the error message)."""
    config = model.config
    model_type = getattr(config, "model_type", "")
    if model_type not in FAMILIES:
        return (
            f"the static engine implements M2M100 (NLLB, the demo model), Marian and MBart; "
            f"{model_type!r} models use engine='hf'"
        )
    decoder = model.get_decoder()
    if model_type == "m2m_100" and not hasattr(getattr(decoder, "embed_positions", None), "get_embedding"):
        return "the decoder has no sinusoidal position table (not an M2M100 decoder); use engine='hf'"
    if model_type != "m2m_100" and not isinstance(getattr(decoder, "embed_positions", None), nn.Embedding):
        return f"the {model_type} decoder has no position table (embed_positions); use engine='hf'"
    if config.d_model % config.decoder_attention_heads:
        return f"d_model {config.d_model} is not a multiple of {config.decoder_attention_heads} heads"
    return None


@dataclass(frozen=True)
class Family:
    """What differs between the families around the layers (the module docstring's table)."""

    name: str
    pre_norm: bool  # layer norm before each sublayer (M2M100, MBart) or after the residual add (Marian)
    pos_offset: int  # table row of target position 0
    pad_positions: bool  # a pad token takes the zero row padding_idx (M2M100's position ids)
    extendable: bool  # the position table can be rebuilt longer (sinusoidal, M2M100's builder)

    @staticmethod
    def of(model: HFModule) -> Family:
        name = FAMILIES[model.config.model_type]
        if name == "m2m100":
            return Family(name, True, int(model.config.pad_token_id) + 1, True, True)
        if name == "marian":
            return Family(name, False, 0, False, False)
        offset = int(getattr(model.get_decoder().embed_positions, "offset", 2))
        return Family(name, True, offset, False, False)


def fused_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device)
    lin = lin.to(weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin.requires_grad_(False)


def cat_bias(parts: list[tuple[nn.Linear, float]]) -> torch.Tensor | None:
    if all(p.bias is None for p, _ in parts):
        return None
    return torch.cat(
        [
            p.bias * s if p.bias is not None else torch.zeros(p.out_features, dtype=p.weight.dtype)
            for p, s in parts
        ]
    )


def fused_qkv(attn: HFModule, scaling: float) -> nn.Linear:
    """The Q, K and V projections of the attention module ``attn`` as one (3d, d) linear, Q's rows (and
    bias) pre-scaled by ``scaling`` (1/sqrt(head_dim): attention then needs no extra multiply)."""
    with torch.no_grad():
        return fused_linear(
            torch.cat([attn.q_proj.weight * scaling, attn.k_proj.weight, attn.v_proj.weight]),
            cat_bias([(attn.q_proj, scaling), (attn.k_proj, 1.0), (attn.v_proj, 1.0)]),
        )


def activation(name: str) -> nn.Module:
    """The feed-forward activation ``name`` (``config.activation_function``): torch's own module for the
    common ones, the same function as transformers' ``ACT2FN`` entry without importing its modeling stack
    (seconds on a small CPU machine); the others from ``ACT2FN``."""
    from fastvocab.decoding.lite_m2m100 import ACTIVATIONS

    if name in ACTIVATIONS:
        return ACTIVATIONS[name]()
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def embed_scale(decoder: HFModule) -> float:
    # M2M100/MBart scale inside their embedding module, Marian in the decoder's forward.
    scale = getattr(decoder.embed_tokens, "embed_scale", None)
    if scale is None:
        scale = getattr(decoder, "embed_scale", None)
    return float(scale or 1.0)
