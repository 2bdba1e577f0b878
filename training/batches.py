"""Training batches: ``BatchStream``, the deterministic, resumable sampler over all directions, and
``collate``, which pads one batch and builds the decoder input (labels shifted right behind ``</s>``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from fastvocab.training.data import Encoded


class BatchStream:
    """Deterministic, resumable stream of token-count batches over all directions.

    Each virtual epoch draws ``n(d)`` examples per direction with ``n(d) ~ size(d)^(1/T)`` (so small
    directions are upsampled), sorts them by length with random tie-breaks (length buckets: little padding),
    cuts batches of at most ``batch_tokens`` padded tokens and shuffles the batch order. An epoch depends only
    on (seed, epoch), so the stream's state is two integers.
    """

    def __init__(
        self, lengths: dict[str, np.ndarray], batch_tokens: int, temperature: float, seed: int
    ) -> None:
        self.directions = sorted(lengths)
        self.lengths = [np.asarray(lengths[d], dtype=np.int64) for d in self.directions]
        sizes = np.array([len(x) for x in self.lengths], dtype=np.float64)
        if sizes.sum() == 0:
            raise ValueError("no training pairs left (all empty or longer than max_len)")
        if max(int(x.max()) if len(x) else 0 for x in self.lengths) > batch_tokens:
            raise ValueError(f"batch_tokens={batch_tokens} is smaller than the longest training sequence")
        weights = np.where(sizes > 0, sizes ** (1.0 / temperature), 0.0)
        self.probs = weights / weights.sum()
        self.epoch_size = int(sizes.sum())
        self.quota = np.round(self.probs * self.epoch_size).astype(np.int64)
        self.batch_tokens = batch_tokens
        self.seed = seed
        self.epoch, self.pos = 0, 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The batches of one virtual epoch; each is an int64 array of (direction index, example index)."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, epoch])
        picks, lens = [], []
        for k, (n, lengths) in enumerate(zip(self.quota, self.lengths, strict=True)):
            if n == 0 or len(lengths) == 0:
                continue
            reps = -(-int(n) // len(lengths))  # upsampling repeats whole permutations
            idx = np.concatenate([rng.permutation(len(lengths)) for _ in range(reps)])[:n]
            picks.append(np.stack([np.full(n, k), idx], axis=1))
            lens.append(lengths[idx])
        pairs, plen = np.concatenate(picks), np.concatenate(lens)
        order = np.lexsort((rng.random(len(plen)), plen))  # by length, random among equal lengths
        batches, start, longest = [], 0, 0
        for i, j in enumerate(order):
            longest_if = max(longest, int(plen[j]))
            if (i - start + 1) * longest_if > self.batch_tokens:
                batches.append(pairs[order[start:i]])
                start, longest_if = i, int(plen[j])
            longest = longest_if
        batches.append(pairs[order[start:]])
        rng.shuffle(batches)
        self._cache = (epoch, batches)
        return batches

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            batches = self.epoch_batches(self.epoch)
            if self.pos >= len(batches):
                self.epoch, self.pos = self.epoch + 1, 0
                continue
            batch = batches[self.pos]
            self.pos += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def collate(
    data: list[Encoded], batch: np.ndarray, pad_id: int, decoder_start_id: int
) -> dict[str, torch.Tensor]:
    """Pad one batch; decoder input = labels shifted right behind the decoder start token (``</s>``)."""
    src = [data[k].src[i] for k, i in batch]
    tgt = [data[k].tgt[i] for k, i in batch]
    b, ls, lt = len(batch), max(map(len, src)), max(map(len, tgt))
    input_ids = np.full((b, ls), pad_id, dtype=np.int64)
    labels = np.full((b, lt), pad_id, dtype=np.int64)
    for r, (s, t) in enumerate(zip(src, tgt, strict=True)):
        input_ids[r, : len(s)] = s
        labels[r, : len(t)] = t
    dec_in = np.full_like(labels, pad_id)
    dec_in[:, 0] = decoder_start_id
    dec_in[:, 1:] = labels[:, :-1]
    input_ids_t = torch.from_numpy(input_ids)
    return {
        "input_ids": input_ids_t,
        "attention_mask": (input_ids_t != pad_id).long(),
        "decoder_input_ids": torch.from_numpy(dec_in),
        "labels": torch.from_numpy(labels),
    }
