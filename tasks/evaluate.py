"""Scoring: sacrebleu BLEU and chrF with signatures, and the search error rate (docs/DESIGN-NOTES.md)."""

from __future__ import annotations

from collections.abc import Sequence


def _check_lengths(a: Sequence[str], b: Sequence[str], what_a: str, what_b: str) -> None:
    if len(a) != len(b):
        raise ValueError(
            f"{len(a)} {what_a} but {len(b)} {what_b}: the files must have one line per sentence"
        )
    if not a:
        raise ValueError(f"no {what_a} to score")


def score(hyps: Sequence[str], refs: Sequence[str], tgt_lang: str | None = None) -> dict:
    """Corpus BLEU and chrF of ``hyps`` against one reference each.

    Returns ``{"bleu", "chrf", "signatures": {"bleu", "chrf"}, "sentences"}``. ``tgt_lang`` lets sacrebleu
    pick its tokenizer for Chinese, Japanese and Korean (recorded in the signature).
    """
    from sacrebleu.metrics import BLEU, CHRF

    _check_lengths(hyps, refs, "hypotheses", "references")
    bleu = BLEU(trg_lang=tgt_lang or "")
    chrf = CHRF()
    refs_list = [list(refs)]
    b = bleu.corpus_score(list(hyps), refs_list)
    c = chrf.corpus_score(list(hyps), refs_list)
    return {
        "bleu": float(b.score),
        "chrf": float(c.score),
        "signatures": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())},
        "sentences": len(hyps),
    }


def search_error_rate(hyps: Sequence[str], ref_hyps: Sequence[str]) -> float:
    """Share of sentences whose output differs from the full-softmax output (same model, search, settings)."""
    _check_lengths(hyps, ref_hyps, "hypotheses", "full-softmax outputs")
    return sum(h != r for h, r in zip(hyps, ref_hyps, strict=True)) / len(hyps)
