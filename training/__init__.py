"""Train the demo model: a small many-to-many M2M100 on the parallel corpus, from scratch.

Plain functions over paths; ``train_demo`` runs the whole job:

1. read the train split of every direction (both directions of each language pair),
2. train a shared SentencePiece vocabulary on a language-balanced sample of the train texts,
3. build the M2M100 tokenizer and model (``training.demo_model``; tied LM head, no output bias),
4. train: AdamW, inverse-sqrt schedule with warmup, label smoothing, token-count batches built from length
   buckets, directions mixed by temperature sampling (small pairs are upsampled, not drowned),
5. checkpoint atomically every few minutes (model, optimizer, scheduler, sampler position, RNG states), so a
   killed run resumes where it stopped,
6. save the model in fp16 with ``save_pretrained`` next to its tokenizer, reload the saved folder with
   ``AutoModelForSeq2SeqLM``/``AutoTokenizer``, score it on the dev split (greedy, sacrebleu BLEU/chrF per
   direction) and write a model card.

Sequences follow the M2M100 convention: encoder input ``__src__ tokens </s>``, labels ``__tgt__ tokens </s>``,
decoder input = labels shifted right behind ``</s>`` (the decoder start token). At generation time the target
tag is forced as the first token (``forced_bos_token_id``).

Modules, in the order a run uses them:

- ``config``: ``TrainConfig`` (preset defaults from ``training.demo_model``) and the recorded hyperparameters,
- ``data``: directions, corpus splits, the SentencePiece sample, bulk encoding (``Encoded``),
- ``batches``: the resumable ``BatchStream`` sampler and ``collate``,
- ``preparation``: corpus -> tokenizer, encoded pairs and batch stream (``Prepared``),
- ``loss``: the chunked tied-head cross-entropy (``seq2seq_loss``) and ``dev_loss``,
- ``checkpoint``: atomic checkpoint save/load and the RNG states,
- ``loop``: the schedule, ``Progress`` and the training loop with its checkpoints and signal handling,
- ``evaluate``: reload, greedy ``model.generate`` and sacrebleu scores of the saved model,
- ``card``: the model card,
- ``save``: the fp16 model folder, dev scores, ``training_summary.json`` and the card,
- ``train``: the entry point ``train_demo`` and its ``TrainResult``.
"""

# What other code imports (the CLI command, the tests, benchmarks/demo_model_quality.py), and the result type.
from fastvocab.training.batches import BatchStream, collate
from fastvocab.training.card import TEST_SCORES_MARKER
from fastvocab.training.checkpoint import load_checkpoint
from fastvocab.training.config import TrainConfig
from fastvocab.training.data import encode_direction, parse_direction
from fastvocab.training.evaluate import load_saved_model, translate
from fastvocab.training.loop import inverse_sqrt
from fastvocab.training.loss import seq2seq_loss
from fastvocab.training.train import TrainResult, train_demo

__all__ = [
    "TEST_SCORES_MARKER",
    "BatchStream",
    "TrainConfig",
    "TrainResult",
    "collate",
    "encode_direction",
    "inverse_sqrt",
    "load_checkpoint",
    "load_saved_model",
    "parse_direction",
    "seq2seq_loss",
    "train_demo",
    "translate",
]
