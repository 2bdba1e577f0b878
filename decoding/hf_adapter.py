"""A Hugging Face seq2seq model seen the way fastvocab decodes it.

The adapter splits a checkpoint (the demo model, M2M100, NLLB, MBart-50, Marian; always from a local folder)
into the pieces the search loop needs:

- ``encode``: source ids -> encoder states,
- ``decoder_step``: one target token per row -> ``h`` (rows, d), the exact input of the output projection,
  with a KV cache carried in the returned state; ``reorder`` selects rows of that state,
- ``output_weight`` / ``output_bias``: the exact ``W`` (N, d) and ``b`` (N,) so that ``h W^T + b`` equals the
  model's logits (tied or untied head, Marian/MBart ``final_logits_bias`` included),
- tokenization with the language tags of each model family (``decoding.language_tags``).

What it hands the search between steps, the encoder's output and the decoder's state, is
``decoding.decoder_states``.

The output projection itself is *not* applied here: the search hands ``h`` to a ``kernels`` projection.

Two decoder-step engines (``engine=``): ``"static"``, the lean preallocated-cache step of
``fastvocab.decoding.static_decoder`` (M2M100, NLLB, the demo model, Marian, MBart), and ``"hf"``, the
Hugging Face decoder called eagerly with a dynamic cache; ``"static"`` also swaps in the padding-free
encoder (``packed_encoder.PackedEncoder``: same states, no work on padding). ``"onnx"`` (CPU, float32) runs
the static engine's decoder layers and the packed encoder's layers in ONNX Runtime
(``decoding/onnx_step.py``, ``decoding/onnx_encoder.py``). All give the same ``h`` (fp32 rounding) and the
same search output. ``"auto"`` (the default) picks ``"onnx"`` on CPU in float32 where ONNX Runtime is
installed and the cache folder can keep its export, else ``"static"``, where the static step is implemented
(every supported family today; a variant it does not recognise falls back to ``"hf"``):
docs/decisions/0021-auto-is-onnx-on-cpu.md.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from fastvocab.artifacts_schema.fingerprint import projection_fingerprint
from fastvocab.decoding.decoder_states import DecoderState, EncoderState
from fastvocab.decoding.fingerprint_cache import cached_fingerprint, remember_fingerprint
from fastvocab.decoding.inference import step_inference
from fastvocab.decoding.language_tags import M2M, MARIAN, MBART, NLLB, fixed_pair, language_ids, model_family
from fastvocab.decoding.piece_table import PieceTable
from fastvocab.decoding.settings import ENGINES

if TYPE_CHECKING:
    from fastvocab.decoding.onnx_step import OnnxDecoder
    from fastvocab.decoding.static_decoder import StaticDecoder

log = logging.getLogger(__name__)


class Seq2SeqAdapter:
    """Encoder, cached decoder step, exact output projection and tokenization of one seq2seq checkpoint.

    ``engine``: "auto" (onnx on CPU in float32, else static, where implemented; else hf), "static" (an
    error for a family it does not implement), "onnx" or "hf"; see the module docstring. ``cache_len``:
    target positions the static engine's self-attention cache holds at first (it doubles when a sentence
    runs longer). ``max_cache_bytes``: the static engine refuses a cache allocation above this (default:
    ``FASTVOCAB_CACHE_LIMIT_MB``, else the device's free memory), with an error naming the sizes.
    """

    def __init__(
        self,
        model,
        tokenizer,
        path: str | Path,
        device: str | torch.device,
        dtype: torch.dtype,
        fingerprint: str | None = None,
        *,
        engine: str = "auto",
        cache_len: int = 64,
        max_cache_bytes: int | None = None,
        from_folder: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self._pieces = PieceTable.of(tokenizer)  # batch tokenization in C++ where the layout allows
        self.path = str(path)
        self.device = torch.device(device)
        self.dtype = dtype
        self.config = model.config
        self._encoder = model.get_encoder()
        self._decoder = model.get_decoder()

        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"model {path} has no output projection (get_output_embeddings() is None)")
        self.output_weight: torch.Tensor = head.weight.detach()  # (N, d)
        bias = None
        if getattr(head, "bias", None) is not None:
            bias = head.bias.detach().clone()
        flb = getattr(model, "final_logits_bias", None)  # Marian, MBart: added after lm_head
        if flb is not None:
            flb = flb.detach().reshape(-1)
            bias = flb.clone() if bias is None else bias + flb
        self.output_bias: torch.Tensor | None = bias  # (N,) or None
        self.n_vocab, self.d_model = self.output_weight.shape
        # A fingerprint handed in (a pipeline worker gets the driver's) is trusted: hashing W is a full read.
        self._fingerprint: str | None = fingerprint

        self.family = model_family(model, tokenizer)
        self.eos_id: int = int(self.config.eos_token_id)
        self.pad_id: int = int(self.config.pad_token_id)
        self.decoder_start_id: int = int(
            self.config.decoder_start_token_id
            if self.config.decoder_start_token_id is not None
            else model.generation_config.decoder_start_token_id
        )
        forced_eos = getattr(model.generation_config, "forced_eos_token_id", None)
        if isinstance(forced_eos, list | tuple):
            forced_eos = forced_eos[0] if len(forced_eos) == 1 else None
        # generate() forces EOS as the last token when the length limit is hit (Marian, BART-style configs).
        self.forced_eos_id: int | None = None if forced_eos is None else int(forced_eos)
        self._lang_ids = language_ids(self.tokenizer, self.family, self.n_vocab)
        # Multi-target Marian: target tags, plus the source language its tokenizer records (if any).
        pair = fixed_pair(self.tokenizer) if self.family == MARIAN else []
        self.languages: list[str] = sorted(set(self._lang_ids) | set(pair))
        trained = getattr(self.config, "fastvocab_languages", None)
        if trained:  # the demo model records the languages it was trained on (its tokenizer knows 100)
            self.languages = [lang for lang in self.languages if lang in set(trained)]
        self.quantized = False
        self.lite = False  # decoding.lite_m2m100's model: the static engine only (load's ``lite``)
        # load's: W and b are the folder's, as its files hold them (before the engine, which may need the
        # fingerprint, so that it is remembered)
        self.from_folder = from_folder
        self._static: StaticDecoder | None = None  # when the engine resolves to "static"
        self.engine = self._pick_engine(engine, cache_len, max_cache_bytes)

    def _pick_engine(self, engine: str, cache_len: int, max_cache_bytes: int | None) -> str:
        from fastvocab.decoding.model_families import unsupported_reason
        from fastvocab.decoding.packed_encoder import PackedEncoder, encoder_unsupported_reason
        from fastvocab.decoding.static_decoder import StaticDecoder

        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
        if cache_len < 1:
            raise ValueError(f"cache_len must be >= 1, got {cache_len}")
        if engine == "hf":
            return "hf"
        reason = unsupported_reason(self.model)
        if reason is not None:
            if engine in ("static", "onnx"):
                raise ValueError(f"engine {engine!r} cannot run {self.path}: {reason}")
            log.debug("engine auto -> hf for %s: %s", self.path, reason)
            return "hf"
        if engine == "auto":
            engine = self._auto_engine()
        self._static = StaticDecoder(self.model, capacity=cache_len, max_cache_bytes=max_cache_bytes)
        if encoder_unsupported_reason(self.model) is None:
            self._encoder = PackedEncoder(self.model)  # padding-free encoder (packed_encoder's docstring)
        if engine == "onnx":  # the static engine's layers run by ONNX Runtime (decoding/onnx_step.py)
            from fastvocab.decoding.onnx_step import OnnxDecoder

            # OnnxDecoder keeps StaticDecoder's interface (step, reorder, caches): the adapter calls it as one
            self._static = cast("StaticDecoder", OnnxDecoder(self._static, lambda: self.fingerprint))
            if isinstance(self._encoder, PackedEncoder):  # its layers too (decoding/onnx_encoder.py)
                from fastvocab.decoding.onnx_encoder import OnnxEncoder

                self._encoder = OnnxEncoder(self._encoder, self.fingerprint)
            return "onnx"
        return "static"

    def _auto_engine(self) -> str:
        """What ``engine="auto"`` runs where the family has the static engine: ``"onnx"`` on CPU in float32
        (the faster of the two, docs/decisions/0021-auto-is-onnx-on-cpu.md), where ONNX Runtime is
        installed and the cache folder can keep the export (else every run would export again); ``"static"``
        otherwise."""
        from fastvocab.decoding.onnx_step import engine_cache_unusable
        from fastvocab.kernels.ort_session import onnx_unavailable

        if self.device.type != "cpu" or self.dtype != torch.float32:
            return "static"
        reason = engine_cache_unusable() or onnx_unavailable()  # the cheap check first
        if reason is not None:
            log.debug("engine auto -> static for %s: %s", self.path, reason)
            return "static"
        return "onnx"

    def quantize_int8(self, encoder: bool = True) -> None:
        """Dynamic int8 quantisation (``torch.ao.quantization.quantize_dynamic``, per output channel) of the
        decoder's linear layers, and of the encoder's with ``encoder=True``. CPU only; the output projection
        is quantised separately (``create_projection("full", ..., int8=True)``), ``W`` here stays exact.
        """
        from fastvocab.kernels.int8 import quantize_linears
        from fastvocab.kernels.prepack import unpack_linears

        if self.device.type != "cpu":
            raise ValueError(f"int8 dynamic quantisation runs on CPU only, the model is on {self.device}")
        if self.dtype != torch.float32:
            raise ValueError(f"int8 quantisation starts from a float32 model, got {self.dtype}")
        if self.engine == "onnx":
            cast("OnnxDecoder", self._static).quantize_int8()
        elif self._static is not None:
            unpack_linears(self._static)  # float32 fast path: its layers go back to nn.Linear, then to int8
            self._static = quantize_linears(self._static)
        else:
            self._decoder = quantize_linears(self._decoder)
        if encoder and hasattr(self._encoder, "use_int8"):  # OnnxEncoder: its graph's int8 export
            self._encoder.use_int8()
        elif encoder:
            self._encoder = quantize_linears(self._encoder)
        self.quantized = True

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        fingerprint: str | None = None,
        *,
        engine: str = "auto",
        cache_len: int = 64,
        max_cache_bytes: int | None = None,
        lite: bool = False,
    ) -> Seq2SeqAdapter:
        """Load a model folder (never a hub name: ``local_files_only=True``).

        ``fingerprint``: the model's known fingerprint (from a ``ModelRef``), so it is not computed again.
        ``engine``, ``cache_len``, ``max_cache_bytes``: the decoder-step engine (see the class). ``lite``: an
        M2M100 folder the static engine runs is read without transformers' modeling code
        (``decoding.lite_m2m100``; seconds less to start), for callers that only decode: teacher forcing
        and the hf engine need the Hugging Face model. Other folders load as usual.
        """
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"model folder not found: {path}")
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is not a model folder (no config.json)")
        loaded = cls._load_lite(path, dtype) if lite and engine != "hf" else None
        if loaded is None:
            from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # a load prints no "Loading weights" bar into a job's log
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForSeq2SeqLM.from_pretrained(path, local_files_only=True, dtype=dtype).eval()
        else:
            model, tokenizer = loaded
        adapter = cls(
            model.to(device),
            tokenizer,
            path,
            device,
            dtype,
            fingerprint,
            engine=engine,
            cache_len=cache_len,
            max_cache_bytes=max_cache_bytes,
            from_folder=True,
        )
        adapter.lite = loaded is not None
        log.debug(
            "loaded %s (%s, N=%d, d=%d, engine %s%s)",
            path,
            adapter.family,
            adapter.n_vocab,
            adapter.d_model,
            adapter.engine,
            ", lite" if adapter.lite else "",
        )
        return adapter

    @staticmethod
    def _load_lite(path: Path, dtype: torch.dtype) -> tuple[Any, Any] | None:
        """The model and tokenizer of ``decoding.lite_m2m100``'s load, or None where the folder or the static
        engine needs the Hugging Face model."""
        from fastvocab.decoding.lite_m2m100 import lite_unsupported_reason, load_lite
        from fastvocab.decoding.model_families import unsupported_reason

        reason = lite_unsupported_reason(path)
        if reason is None:
            model, tokenizer = load_lite(path, dtype)
            reason = unsupported_reason(model)
        if reason is not None:
            log.debug("lite load of %s: no (%s)", path, reason)
            return None
        return model, tokenizer

    def _hf_only(self, what: str) -> None:
        if self.lite:
            raise RuntimeError(f"{what} needs the Hugging Face model: load {self.path} with lite=False")

    @property
    def fingerprint(self) -> str:
        """``projection_fingerprint(W, b)`` of the checkpoint's ``W`` and ``b`` read in float32: ties cluster
        maps and hidden-state dumps to this model whatever dtype it is loaded in.

        A model loaded below float32 from a folder is read once more, in float32 on the CPU, for it: the
        float16 or bfloat16 rounding of a float32 checkpoint would hash differently, and a map built from the
        float32 load (the pipeline's ``describe_model``) would be refused by ``--dtype float16``.
        """
        # only a model read as its folder holds it is the folder's: an adapter built around a model in memory
        # may have changed its weights
        if self._fingerprint is None and self.from_folder:
            self._fingerprint = cached_fingerprint(Path(self.path))
        if self._fingerprint is None:
            if self.dtype != torch.float32 and Path(self.path).is_dir():
                log.debug("fingerprint of %s: reading W in float32 (loaded in %s)", self.path, self.dtype)
                self._fingerprint = Seq2SeqAdapter.load(self.path, engine="hf").fingerprint
            else:
                b = None if self.output_bias is None else self.output_bias.float().cpu().numpy()
                self._fingerprint = projection_fingerprint(self.output_weight.float().cpu().numpy(), b)
            if self.from_folder:
                remember_fingerprint(Path(self.path), self._fingerprint)
        return self._fingerprint

    # ------------------------------------------------------------------ languages

    @property
    def multi_target_marian(self) -> bool:
        return self.family == MARIAN and bool(self._lang_ids)

    def check_language(self, lang: str) -> None:
        """Raise ``ValueError`` naming the model and the valid codes when ``lang`` is not one of them."""
        if not self.languages:  # a Marian pair model that does not record its languages
            return
        if lang not in self.languages:
            valid = ", ".join(self.languages)
            raise ValueError(f"unknown language {lang!r} for model {self.path}; valid: {valid}")

    def lang_id(self, lang: str) -> int:
        """Vocabulary id of a language tag (M2M100/NLLB/MBart, multi-target Marian)."""
        self.check_language(lang)
        if lang not in self._lang_ids:
            raise ValueError(f"model {self.path} has no language tag for {lang!r}")
        return self._lang_ids[lang]

    def always_active_ids(self) -> list[int]:
        """EOS + the language-tag ids: columns any candidate-set method must always compute."""
        tags = (self._lang_ids[lang] for lang in self.languages if lang in self._lang_ids)
        return sorted({self.eos_id, *tags})

    @property
    def static_decoder(self):
        """The :class:`~fastvocab.decoding.static_decoder.StaticDecoder` of the static engine (None with
        engine="hf"), for callers that drive its fixed-shape step themselves (a CUDA graph, the GPU
        campaign)."""
        return self._static

    def open_sessions(self) -> None:
        """Open the onnx engine's ONNX Runtime sessions now (nothing on the other engines): ``translate``
        calls it before forking its workers, which then run the ones they inherit instead of each opening
        its own (~25 ms for the demo model's two, int8)."""
        for part in (self._encoder, self._static):
            session = getattr(part, "session", None)
            if session is not None:
                session.get()

    @property
    def early_stopping(self) -> bool | str:
        """Beam search's stopping rule from the model's generation config, as ``generate`` reads it: True
        (M2M100/NLLB checkpoints), False (the transformers default) or "never"."""
        value = getattr(self.model.generation_config, "early_stopping", False)
        return value if value in (True, "never") else False

    def suppressed_ids(self) -> list[int]:
        """Ids ``generate`` never emits for this model (single-token ``bad_words_ids``, ``suppress_tokens``).

        Marian checkpoints ban the pad token (their decoder start) this way.
        """
        gc = self.model.generation_config
        ids: set[int] = set()
        for seq in getattr(gc, "bad_words_ids", None) or []:
            if len(seq) == 1:
                ids.add(int(seq[0]))
        ids.update(int(i) for i in (getattr(gc, "suppress_tokens", None) or []))
        return sorted(i for i in ids if 0 <= i < self.n_vocab)

    # ------------------------------------------------------------------ tokenization

    def tokenize(self, texts: list[str], src_lang: str, tgt_lang: str | None = None) -> list[list[int]]:
        """Source ids per text, with the family's language tags and EOS, unpadded."""
        self.check_language(src_lang)
        tok = self.tokenizer
        if self.family in (M2M, NLLB, MBART):
            tok.src_lang = src_lang  # sets the prefix/suffix language tag
        elif self.multi_target_marian:
            if tgt_lang is None:
                raise ValueError(f"model {self.path} needs the target language to tokenize the source")
            self.check_language(tgt_lang)
            texts = [f">>{tgt_lang}<< {t}" for t in texts]
        if not texts:
            return []
        if self._pieces is not None:  # the tokenizer's own tags around the pieces (M2M100: [tag] ... [EOS])
            head, tail = list(tok.prefix_tokens), list(tok.suffix_tokens)
            plain = self._pieces.encode(list(texts), lambda odd: self._hf_ids(odd, add_special_tokens=False))
            return [head + ids + tail for ids in plain]
        return self._hf_ids(list(texts), add_special_tokens=True)

    def _hf_ids(self, texts: list[str], add_special_tokens: bool, target: bool = False) -> list[list[int]]:
        """The tokenizer's own ids (source side, or ``target``: the reference side)."""
        if not texts:
            return []
        if target:
            out = self.tokenizer(text_target=texts, add_special_tokens=add_special_tokens)
        else:
            out = self.tokenizer(texts, add_special_tokens=add_special_tokens)
        return [list(ids) for ids in out["input_ids"]]

    def pad(self, seqs: list[list[int]]) -> dict[str, torch.Tensor]:
        """Right-pad id lists into ``input_ids`` / ``attention_mask`` (rows, S) on the adapter's device."""
        width = max((len(s) for s in seqs), default=0)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def encode_texts(self, texts: list[str], src_lang: str, tgt_lang: str | None = None) -> dict:
        """Tokenize and pad a batch: ``{"input_ids", "attention_mask"}`` (rows, S) on the device."""
        return self.pad(self.tokenize(texts, src_lang, tgt_lang))

    def tokenize_targets(self, texts: list[str], tgt_lang: str) -> list[list[int]]:
        """Target-side ids of reference translations, without language tags or EOS (the pieces a search
        would generate), tokenized as the model's target side (Marian has a vocabulary per side)."""
        self.check_language(tgt_lang)
        if not texts:
            return []
        tok = self.tokenizer
        if self.family in (M2M, NLLB, MBART):
            tok.tgt_lang = tgt_lang
        if self._pieces is not None:
            return self._pieces.encode(list(texts), lambda odd: self._hf_ids(odd, False, target=True))
        return self._hf_ids(list(texts), add_special_tokens=False, target=True)

    def decode_ids(self, seqs: list[list[int]]) -> list[str]:
        """Token ids -> text, without specials or language tags."""
        drop = set(self.always_active_ids()) | {self.pad_id, self.decoder_start_id}
        cleaned = [[int(t) for t in s if int(t) not in drop] for s in seqs]
        return self.tokenizer.batch_decode(cleaned, skip_special_tokens=True)

    # ------------------------------------------------------------------ model steps

    def start_tokens(self, tgt_lang: str) -> list[int]:
        """Forced decoder prefix: ``[decoder_start, tgt tag]`` (M2M100/NLLB/MBart) or ``[decoder_start]``.

        ``generate(forced_bos_token_id=tag)`` gives the tag probability 1 at the first position, so its
        scores equal those of decoding after this prefix.
        """
        self.check_language(tgt_lang)
        if self.family in (M2M, NLLB, MBART):
            return [self.decoder_start_id, self.lang_id(tgt_lang)]
        return [self.decoder_start_id]

    @torch.inference_mode()
    def encode(self, batch: dict) -> EncoderState:
        mask = batch["attention_mask"].to(self.device)
        out = self._encoder(input_ids=batch["input_ids"].to(self.device), attention_mask=mask)
        hidden = out if isinstance(out, torch.Tensor) else out.last_hidden_state  # PackedEncoder: a tensor
        return EncoderState(hidden=hidden, mask=mask)  # (rows, S, d), (rows, S)

    @step_inference
    def decoder_step(
        self, tokens: torch.Tensor, state: EncoderState | DecoderState
    ) -> tuple[torch.Tensor, DecoderState]:
        """Feed one token per row; return ``h`` (rows, d), the lm_head input for the next position.

        ``state`` is the ``EncoderState`` for the first step, then the returned ``DecoderState``. The cache is
        updated in place: the state passed in must not be reused afterwards.
        """
        if self._static is not None:
            if isinstance(state, EncoderState):
                cache = self._static.start(state.hidden, state.mask, capacity=state.positions)
                state = DecoderState(None, cache, 0)
            if tokens.dim() != 1 or tokens.shape[0] != state.rows:
                raise ValueError(f"tokens must be ({state.rows},), got {tuple(tokens.shape)}")
            h = self._static.step(tokens, state.cache)  # (rows, d); the cache advanced in place
            return h, DecoderState(None, state.cache, state.length + 1)
        self._hf_only("the hf engine")
        if isinstance(state, EncoderState):
            from transformers import DynamicCache, EncoderDecoderCache

            state = DecoderState(
                encoder=state,
                cache=EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config)),
                length=0,
            )
        if tokens.dim() != 1 or tokens.shape[0] != state.rows:
            raise ValueError(f"tokens must be ({state.rows},), got {tuple(tokens.shape)}")
        assert state.encoder is not None  # the hf engine's state carries the encoder's output
        out = self._decoder(
            input_ids=tokens.to(self.device)[:, None],  # (rows, 1)
            encoder_hidden_states=state.encoder.hidden,
            encoder_attention_mask=state.encoder.mask,
            past_key_values=state.cache,
            use_cache=True,
        )
        h = out.last_hidden_state[:, -1, :]  # (rows, d): after the final layer norm, what lm_head multiplies
        return h, DecoderState(state.encoder, out.past_key_values, state.length + 1)

    @torch.inference_mode()
    def teacher_forced(
        self, state: EncoderState, tgt_lang: str, targets: list[list[int]], max_len: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The states a search would give the projection if it generated ``targets`` (teacher forcing): one
        batched decoder pass over ``start_tokens + target`` per row, no search and no cache.

        Returns ``(h (states, d), row (states,), step (states,))`` for steps ``0 .. len(target)`` of each row
        (the last one predicts EOS), at most ``max_len`` steps a row, rows in order, steps ascending: the
        rows and steps a greedy search along the same tokens would record. The HF decoder runs here whatever
        the engine (the static engine has no causal multi-token step); the two agree to fp32 rounding.
        """
        self._hf_only("teacher forcing")
        prefix = self.start_tokens(tgt_lang)
        if len(targets) != state.hidden.shape[0]:
            raise ValueError(f"{len(targets)} targets for {state.hidden.shape[0]} encoded sources")
        # step t's state sits at position len(prefix) - 1 + t; a row has len(target) + 1 steps
        steps = [min(len(t) + 1, max_len) for t in targets]
        seqs = [prefix + list(t[: n - 1]) for t, n in zip(targets, steps, strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        out = self._decoder(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            encoder_hidden_states=state.hidden,
            encoder_attention_mask=state.mask,
            use_cache=False,
        )
        hidden = (
            out.last_hidden_state
        )  # (rows, width, d): after the final layer norm, what lm_head multiplies
        keep = mask.bool()
        keep[:, : len(prefix) - 1] = False  # the prefix's own states predict the forced prefix
        pos = torch.arange(width).expand(len(seqs), width)
        row = torch.arange(len(seqs))[:, None].expand(len(seqs), width)
        return (
            hidden[keep.to(self.device)],
            row[keep].to(self.device),
            (pos[keep] - (len(prefix) - 1)).to(self.device),
        )

    def reorder(
        self, state: EncoderState | DecoderState, index: torch.Tensor, group: int | None = None
    ) -> EncoderState | DecoderState:
        """Select/reorder rows (beam reordering, dropping finished rows); ``index`` (rows',) int64.

        The KV cache is re-indexed (new tensors); ``state`` must not be reused. ``group`` is a promise that
        rows ``[i*group, (i+1)*group)`` of the result come from one source sentence, sources in increasing
        order and none twice (beam search): the static engine then keeps cross-attention keys/values per
        sentence and does not copy them on a beam reorder. The hf engine ignores it.
        """
        index = index.to(self.device)
        if isinstance(state, EncoderState):
            hidden, mask = state.hidden.index_select(0, index), state.mask.index_select(0, index)
            return EncoderState(hidden, mask, state.positions)
        src = state.encoder
        if src is None:  # static engine
            assert self._static is not None
            return DecoderState(None, self._static.reorder(state.cache, index, group), state.length)
        enc = EncoderState(src.hidden.index_select(0, index), src.mask.index_select(0, index))
        state.cache.reorder_cache(index)
        return DecoderState(enc, state.cache, state.length)
