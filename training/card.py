"""The model card (``README.md`` of the saved model folder), written from a training summary: front matter,
usage, architecture, data, training recipe and log, the sessions of a resumed run, and the dev score table.
``TEST_SCORES_MARKER`` ends it; ``benchmarks/demo_model_quality.py`` writes the test scores after it."""

from __future__ import annotations

from typing import Any

from fastvocab.training.data import parse_direction

TEST_SCORES_MARKER = "<!-- test-scores -->"


def _score_table(scores: dict[str, dict]) -> list[str]:
    rows = ["| direction | sentences | BLEU | chrF |", "| --- | ---: | ---: | ---: |"]
    rows += [f"| {d} | {x['sentences']} | {x['bleu']:.1f} | {x['chrf']:.1f} |" for d, x in scores.items()]
    return rows


def _sessions_section(sessions: list[dict]) -> list[str]:
    """A table of the training sessions when the run was resumed with another budget or recipe."""
    if len(sessions) < 2:
        return []
    keys = ["batch_tokens", "lr", "warmup", "dropout", "temperature", "max_minutes", "max_steps", "note"]
    rows = [
        "The run was resumed from its checkpoint; each session's budget and recipe (the table above shows "
        "the last):",
        "",
        "| from step | from minute | " + " | ".join(keys) + " |",
        "| ---: | ---: | " + " | ".join("---" for _ in keys) + " |",
    ]
    for x in sessions:
        rows.append(
            f"| {x['start_step']} | {x['start_minutes']} | "
            + " | ".join(str(x.get(k, "")) for k in keys)
            + " |"
        )
    rows += ["", "Commands, one per session:", "", "```bash"]
    rows += [x.get("command") or "(library call)" for x in sessions]
    return [*rows, "```", ""]


def model_card(summary: dict[str, Any]) -> str:
    """The model card (README.md of the model folder) from a training summary.

    An optional ``status`` entry (added to ``training_summary.json`` by hand) is shown above the model table.
    """
    arch, hp, dev = summary["arch"], summary["hyperparameters"], summary["dev"]
    sig: dict = next(iter(dev.values()), {})
    langs = sorted({lang for d in summary["directions"] for lang in parse_direction(d)})
    data_rows = [
        f"| {d} | {summary['train_pairs'][d]:,} | {summary['dropped_longer_than_max_len'][d]:,} "
        f"| {summary['sampling_probs'][d]:.3f} |"
        for d in summary["directions"]
    ]
    hist_rows = [
        f"| {h['step']} | {h['minutes']:.1f} | {h.get('loss', float('nan')):.3f} | "
        f"{h.get('nll', float('nan')):.3f} | {h['dev_nll']:.3f} | {h.get('tok_per_s', 0)} |"
        for h in summary["history"]
    ]
    lines = [
        "---",
        f"language: [{', '.join(langs)}]",
        "license: apache-2.0",
        "library_name: transformers",
        "pipeline_tag: translation",
        "tags: [m2m_100, fastvocab, demo]",
        "---",
        "",
        "# fastvocab demo model (M2M100 architecture, trained from scratch)",
        "",
        "A small many-to-many translation model for trying fastvocab's clustered vocabulary projection: a "
        f"shared {summary['vocab_size']:,}-entry vocabulary (SentencePiece unigram + M2M100 language tags) "
        "and a lean decoder, so the output projection is a large share of each decoding step, as in the "
        "large multilingual models the method is for. It is a demo, not a production translator: small, "
        "trained "
        "briefly on software package descriptions.",
        "",
        "Load it offline with the standard classes (the weights are fp16; use float32 on CPU):",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tok = AutoTokenizer.from_pretrained("models/demo")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("models/demo", dtype=torch.float32)',
        'tok.src_lang = "en"',
        'batch = tok(["a library for network graphics"], return_tensors="pt")',
        'out = model.generate(**batch, forced_bos_token_id=tok.get_lang_id("it"))',
        "print(tok.batch_decode(out, skip_special_tokens=True))",
        "```",
        "",
        "or `fastvocab translate --model models/demo --src-lang en --tgt-lang it -i in.txt -o out.txt`.",
        "",
        *([f"**Status:** {summary['status']}", ""] if summary.get("status") else []),
        "## Model",
        "",
        "| | |",
        "| --- | --- |",
        "| architecture | M2M100 (`M2M100ForConditionalGeneration`), pre-norm, sinusoidal positions |",
        f"| preset | `{summary['preset']}` |",
        f"| d_model / FFN / heads | {arch['d_model']} / {arch['ffn']} / {arch['heads']} |",
        f"| encoder / decoder layers | {arch['enc_layers']} / {arch['dec_layers']} |",
        f"| vocabulary | {summary['vocab_size']:,} (SentencePiece {arch['vocab']:,} + language tags) |",
        "| output layer | tied to the shared embeddings, **no bias** |",
        f"| parameters | {summary['params'] / 1e6:.2f}M |",
        "| weights | fp16 safetensors |",
        "",
        "Sequences follow M2M100: encoder input `__src__ tokens </s>`, the decoder starts with `</s>`, and "
        "the target-language tag `__tgt__` is forced as the first generated token (`forced_bos_token_id`).",
        "",
        "## Data",
        "",
        "Debian package description translations (the corpus built by `fastvocab corpus`), both directions "
        f"of every language pair; pairs longer than {hp['max_len']} tokens on either side are dropped.",
        "",
        "| direction | train pairs | dropped (too long) | sampling probability |",
        "| --- | ---: | ---: | ---: |",
        *data_rows,
        "",
        f"Directions are mixed in every batch by temperature sampling (T={hp['temperature']}: p(d) ~ "
        "n(d)^(1/T)), so the small pairs are upsampled.",
        "",
        "## Training",
        "",
        "| | |",
        "| --- | --- |",
        f"| steps | {summary['steps']:,} |",
        f"| tokens seen (source + target, no padding) | {summary['train_tokens']:,} |",
        f"| training wall time | {summary['train_minutes']:.1f} min |",
        f"| device | {summary['device']} |",
        f"| batch | up to {hp['batch_tokens']:,} padded tokens per side, length-bucketed |",
        f"| optimizer | AdamW (0.9, 0.98), weight decay {hp['weight_decay']}, clip norm {hp['clip_norm']} |",
        f"| schedule | inverse square root, peak lr {hp['lr']} after {hp['warmup']} warmup steps |",
        f"| loss | cross-entropy, label smoothing {hp['label_smoothing']} |",
        f"| dropout | {hp['dropout']} |",
        f"| seed | {hp['seed']} |",
        "",
        "Command (of the last session when the run was resumed):",
        "",
        "```bash",
        summary["command"] or "(library call: fastvocab.training.train_demo)",
        "```",
        "",
        *_sessions_section(summary.get("sessions", [])),
        "Training log, one row per checkpoint (train figures: mean over the last logging window):",
        "",
        "| step | minutes | train loss | train nll | dev nll | tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        *hist_rows,
        "",
        f"## Dev scores (greedy `model.generate`, first {sig.get('sentences', 0)} dev pairs per direction)",
        "",
        *_score_table(dev),
        "",
        f"BLEU: `{sig.get('bleu_signature', '')}`; chrF: `{sig.get('chrf_signature', '')}`.",
        "",
        TEST_SCORES_MARKER,
        "",
    ]
    return "\n".join(lines)
