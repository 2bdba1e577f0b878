"""An M2M100 checkpoint (the demo model, M2M100, NLLB's layout) loaded without transformers' modeling code.

Why: importing a transformers model class pulls in its whole modeling stack (torch.distributed, dynamo,
sympy, the hub kernels), seconds on a small CPU machine, and a one-line ``fastvocab translate`` spent most of
its wall time there. The static engine (``static_decoder``) and the packed encoder (``packed_encoder``) only
read weights by the Hugging Face attribute names, so this module builds bare modules with those names from
``config.json`` and the safetensors file, and a tokenizer from the SentencePiece model and ``vocab.json``.

What it cannot do, it leaves to transformers: :func:`lite_unsupported_reason` names why a folder takes the
Hugging Face load, and the tokenizer hands any text or id sequence outside its plain path (a line holding an
added token's text, an added id in an output) to the Hugging Face tokenizer, loaded on first need. The module
tree has no ``forward``: only the static engine decodes with it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

# Activations the lite modules build themselves; their Hugging Face namesakes compute the same functions.
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "swish": nn.SiLU}
_WEIGHTS = "model.safetensors"
_TOKENIZER_FILES = ("vocab.json", "sentencepiece.bpe.model", "tokenizer_config.json", "added_tokens.json")
_CONFIG_KEYS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "vocab_size",
    "pad_token_id",
    "eos_token_id",
    "max_position_embeddings",
    "activation_function",
)


class Config:
    """A ``config.json`` (or ``generation_config.json``) read as attributes, as transformers' configs are."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        # only reached for keys the file lacks: transformers' defaults for the ones fastvocab reads
        if name in ("decoder_start_token_id", "forced_eos_token_id", "bad_words_ids", "suppress_tokens"):
            return None
        if name == "early_stopping":
            return False
        raise AttributeError(name)


def lite_unsupported_reason(path: str | Path) -> str | None:
    """None when :func:`load_lite` can load the model folder ``path``; else why not."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        tok = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"config unreadable: {exc}"
    if config.get("model_type") != "m2m_100":
        return f"model type {config.get('model_type')!r} is not m2m_100"
    if tok.get("tokenizer_class") != "M2M100Tokenizer" or tok.get("language_codes", "m2m100") != "m2m100":
        return f"tokenizer {tok.get('tokenizer_class')!r} is not an M2M100Tokenizer with m2m100 codes"
    missing = [k for k in _CONFIG_KEYS if k not in config]
    if missing:
        return f"config.json lacks {', '.join(missing)}"
    if config["activation_function"] not in ACTIVATIONS:
        return f"activation {config['activation_function']!r}"
    if not config.get("tie_word_embeddings", True):
        return "an untied output layer"
    absent = [f for f in (_WEIGHTS, *_TOKENIZER_FILES) if not (path / f).is_file()]
    if absent:
        return f"no {', '.join(absent)}"
    return None


def sinusoidal_table(n: int, d: int, padding_idx: int | None = None) -> torch.Tensor:
    """M2M100's sinusoidal position table (transformers' ``get_embedding``, the same arithmetic)."""
    half = d // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
    angles = torch.arange(n, dtype=torch.int64).float().unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).view(n, -1)
    if d % 2 == 1:
        table = torch.cat([table, torch.zeros(n, 1)], dim=1)
    if padding_idx is not None:
        table[padding_idx, :] = 0
    return table.to(torch.get_default_dtype())


class _Positions(nn.Module):
    get_embedding = staticmethod(sinusoidal_table)


class _Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))


class _Layer(nn.Module):
    def __init__(self, d: int, ffn: int, cross: bool) -> None:
        super().__init__()
        self.self_attn = _Attention(d)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        if cross:
            self.encoder_attn = _Attention(d)
            self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.final_layer_norm = nn.LayerNorm(d)


class _Stack(nn.Module):
    """An encoder or decoder: embeddings, layers, final norm (the Hugging Face names)."""

    def __init__(
        self, shared: nn.Embedding, scale: float, layers: int, d: int, ffn: int, cross: bool
    ) -> None:
        super().__init__()
        self.embed_tokens = shared
        self.embed_scale = scale
        self.embed_positions = _Positions()
        self.layers = nn.ModuleList(_Layer(d, ffn, cross) for _ in range(layers))
        self.layer_norm = nn.LayerNorm(d)


class LiteM2M100(nn.Module):
    """The weights of an M2M100 checkpoint under transformers' names, with the accessors the adapter uses."""

    def __init__(self, config: Config, generation_config: Config) -> None:
        super().__init__()
        c = config
        self.config, self.generation_config = c, generation_config
        shared = nn.Embedding(c.vocab_size, c.d_model, c.pad_token_id)
        scale = math.sqrt(c.d_model) if getattr(c, "scale_embedding", False) else 1.0
        # as M2M100ScaledWordEmbedding (model_families.embed_scale reads it)
        shared.embed_scale = scale  # type: ignore[assignment]
        self.encoder = _Stack(shared, scale, c.encoder_layers, c.d_model, c.encoder_ffn_dim, cross=False)
        self.decoder = _Stack(shared, scale, c.decoder_layers, c.d_model, c.decoder_ffn_dim, cross=True)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = shared.weight

    def get_encoder(self) -> nn.Module:
        return self.encoder

    def get_decoder(self) -> nn.Module:
        return self.decoder

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def load_lite(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[LiteM2M100, LiteM2M100Tokenizer]:
    """(model, tokenizer) of the folder ``path`` (:func:`lite_unsupported_reason` must be None), on the CPU,
    in eval mode, weights in ``dtype``."""
    from safetensors.torch import load_file

    path = Path(path)
    gen = path / "generation_config.json"
    model = LiteM2M100(
        Config(_read_json(path / "config.json")), Config(_read_json(gen) if gen.is_file() else {})
    )
    model = model.to(dtype)
    embedding = (
        "shared.weight",
        "encoder.embed_tokens.weight",
        "decoder.embed_tokens.weight",
        "lm_head.weight",
    )
    state, shared = {}, None
    for key, value in load_file(path / _WEIGHTS).items():
        key = key.removeprefix("model.")
        if key in embedding:  # tied: one matrix for both stacks and the output layer
            shared = value if shared is None or key == "shared.weight" else shared
        else:
            state[key] = value
    named = dict(model.named_parameters())
    embed = "encoder.embed_tokens.weight"
    missing = [n for n in named if n not in state and n != embed]
    extra = [n for n in state if n not in named]
    if shared is None or missing or extra:
        raise ValueError(f"{path}/{_WEIGHTS}: missing {missing[:3]}, unexpected {extra[:3]}")
    state[embed] = shared
    with torch.no_grad():
        for name, value in state.items():
            named[name].copy_(value.to(dtype))
    return model.eval().requires_grad_(False), LiteM2M100Tokenizer(path)


class LiteM2M100Tokenizer:
    """M2M100Tokenizer's plain path: SentencePiece pieces mapped through ``vocab.json``, the language tags
    of ``added_tokens.json``; anything else goes to the Hugging Face tokenizer, loaded on first need."""

    is_fast = False

    def __init__(self, path: str | Path) -> None:
        import sentencepiece

        path = Path(path)
        self.path = path
        cfg = _read_json(path / "tokenizer_config.json")
        self.encoder: dict[str, int] = _read_json(path / "vocab.json")
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.sp_model = sentencepiece.SentencePieceProcessor()
        self.sp_model.Load(str(path / "sentencepiece.bpe.model"))
        self.added: dict[str, int] = _read_json(path / "added_tokens.json")
        self.lang_code_to_id = {
            t[2:-2]: i for t, i in self.added.items() if t.startswith("__") and t.endswith("__")
        }
        self.unk_token = cfg.get("unk_token", "<unk>")
        self.unk_token_id = self.encoder[self.unk_token]
        self.eos_token_id = self.encoder[cfg.get("eos_token", "</s>")]
        self.pad_token_id = self.encoder[cfg.get("pad_token", "<pad>")]
        specials = [cfg.get(k, d) for k, d in (("bos_token", "<s>"), ("eos_token", "</s>"))]
        specials += [cfg.get(k, d) for k, d in (("pad_token", "<pad>"), ("unk_token", "<unk>"))]
        self._specials = {t: self.encoder[t] for t in specials if t in self.encoder}
        self.all_special_ids = sorted({*self._specials.values(), *self.lang_code_to_id.values()})
        self._special_set = set(self.all_special_ids)
        self._hf: Any = None
        self.src_lang = cfg.get("src_lang") or "en"
        self.tgt_lang = cfg.get("tgt_lang")

    @property
    def src_lang(self) -> str:
        return self._src_lang

    @src_lang.setter
    def src_lang(self, lang: str) -> None:
        self._src_lang = lang
        self.prefix_tokens = [self.lang_code_to_id[lang]]
        self.suffix_tokens = [self.eos_token_id]

    def get_added_vocab(self) -> dict[str, int]:
        return {**self._specials, **self.added}

    def hf(self) -> Any:
        """The Hugging Face tokenizer of the same folder, set to this one's languages."""
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        self._hf.src_lang = self.src_lang
        if self.tgt_lang is not None:
            self._hf.tgt_lang = self.tgt_lang
        return self._hf

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hf()(*args, **kwargs)

    def batch_decode(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Each id sequence as text; one that holds an added (non-special) id or skips no specials is
        decoded by the Hugging Face tokenizer."""
        out = []
        for ids in seqs:
            kept = [i for i in ids if i not in self._special_set]
            if not skip_special_tokens or any(i not in self.decoder for i in kept):
                out.append(self.hf().decode(ids, skip_special_tokens=skip_special_tokens))
            else:
                out.append(self.sp_model.decode([self.decoder[i] for i in kept]).strip())
        return out
