"""How each model family tags languages (the source side and the forced target prefix): which family a
checkpoint is, the ids of its language tags, and the languages a Marian pair model records."""

from __future__ import annotations

import re

# Model families by how they tag languages (source side and forced target prefix).
M2M = "m2m"  # M2M100 and the demo model: "__xx__" tags, src tag prepended, tgt tag forced after </s>
NLLB = "nllb"  # NLLB: "eng_Latn" tags, same scheme as M2M100
MBART = "mbart"  # MBart-50: "en_XX" tags, same target scheme
MARIAN = "marian"  # Marian: fixed pair, or ">>xx<<" target token in the source text (multi-target models)

NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")
MBART_CODE = re.compile(r"^[a-z]{2}_[A-Z]{2}$")
MARIAN_TAG = re.compile(r"^>>([A-Za-z_]+)<<$")


def _special_tokens(tok) -> list[str]:
    toks = list(getattr(tok, "additional_special_tokens", None) or [])
    toks += [
        t.content for t in getattr(tok, "added_tokens_decoder", {}).values() if getattr(t, "special", False)
    ]
    return list(dict.fromkeys(toks))


def model_family(model, tokenizer) -> str:
    """How ``model`` tags languages: M2M, NLLB, MBART or MARIAN; a ValueError for any other model."""
    model_type = getattr(model.config, "model_type", "")
    tok_name = type(tokenizer).__name__.lower()
    if model_type == "marian":
        return MARIAN
    if "nllb" in tok_name:
        return NLLB
    if model_type == "m2m_100":
        return M2M
    if model_type == "mbart" or "mbart" in tok_name:
        return MBART
    raise ValueError(
        f"unsupported model type {model_type!r} (tokenizer {type(tokenizer).__name__}); "
        "supported: M2M100 (and the demo model), NLLB, MBart-50, Marian"
    )


def language_ids(tok, family: str, n_vocab: int) -> dict[str, int]:
    """Language code -> id of its tag in the vocabulary of tokenizer ``tok`` of a ``family`` model, for the
    tags the model can emit and read (ids below ``n_vocab``)."""
    ids: dict[str, int] = {}
    if family == M2M and hasattr(tok, "lang_code_to_id"):
        ids = {code: int(i) for code, i in tok.lang_code_to_id.items()}
    elif family in (NLLB, MBART):
        pattern = NLLB_CODE if family == NLLB else MBART_CODE
        for t in _special_tokens(tok):
            if pattern.match(t):
                ids[t] = int(tok.convert_tokens_to_ids(t))
    elif family == MARIAN:
        for t, i in tok.get_vocab().items():
            m = MARIAN_TAG.match(t)
            if m:
                ids[m.group(1)] = int(i)
    # Only tags the model can actually emit/read.
    return {code: i for code, i in ids.items() if 0 <= i < n_vocab}


def fixed_pair(tok) -> list[str]:
    """A Marian pair model's languages, where its tokenizer ``tok`` records them (else nothing to check
    against)."""
    langs = [getattr(tok, a, None) for a in ("source_lang", "target_lang")]
    return [lang for lang in langs if isinstance(lang, str) and lang]
