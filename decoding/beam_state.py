"""Beam search's state for a batch of sentences and its step (:class:`BeamState`): the live beams, the pool
of finished hypotheses and the stopping rule, as ``generate`` runs them; on CPU the step is one compiled call
(``host_beam_step.advance``), elsewhere tensor ops that read nothing back to the host."""

from __future__ import annotations

import numpy as np
import torch

from fastvocab.decoding.beam_kernels import compiled_step
from fastvocab.decoding.stopping import check_stopping_rule

# Score given to impossible beams, as in transformers (finite, so sums stay ordered).
_NEG = -1.0e9


class BeamState:
    """Beam search's state for ``n`` sentences x ``k`` beams and its step (:meth:`advance`): the candidates,
    the pool of finished hypotheses and the stopping rule, as ``generate`` runs them. Used by
    :func:`beam_search`: with the eager stepper it drops done sentences at its host reads (:meth:`keep`);
    with fixed shapes nothing is read back to the host, so sentences stay and a done sentence's finished
    hypotheses stay frozen.

    ``host``: the eager search on CPU, where a host read is free: the step runs in numpy on the tensors'
    memory (:meth:`_advance_host`), merges finished candidates into the pool only at steps that have some,
    and checks the stopping rule only once the pool took one (``pooled``). Otherwise the step is tensor ops
    that read nothing back (an accelerator, CUDA graphs), merging and checking every step to the same result.
    """

    def __init__(
        self,
        n: int,
        k: int,
        max_len: int,
        prefix_len: int,
        length_penalty: float,
        rule: bool | str,
        eos: int,
        device: torch.device,
        host: bool = False,
    ) -> None:
        check_stopping_rule(rule)
        if host and device.type != "cpu":
            raise ValueError(f"a beam state on the host needs CPU tensors, got {device}")
        self.k, self.max_len, self.rule, self.eos, self.lp = k, max_len, rule, eos, length_penalty
        self.host = host
        # Whether the pool may hold a finished hypothesis, as the host knows it: lazily, from the first merge.
        self.pooled = not host
        self.run_scores = torch.full((n, k), _NEG, device=device)  # cumulative log-prob of the live beams
        self.run_scores[:, 0] = 0.0  # identical beams at the start: only the first one may expand
        self.run_seqs = torch.full((n, k, max_len), eos, dtype=torch.long, device=device)  # (n, k, T)
        self.fin_scores = torch.full((n, k), _NEG, device=device)  # normalised scores of finished hyps
        self.fin_seqs = torch.full((n, k, max_len), eos, dtype=torch.long, device=device)
        self.fin_any = torch.zeros((n, k), dtype=torch.bool, device=device)  # the slot holds a real one
        # Sentences done (found since the last host read, in beam_search): finished hypotheses frozen, as
        # generate adds none to a done sentence either.
        self.done = torch.zeros(n, dtype=torch.bool, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # the column of the sequences
        self.top_k_mask = torch.arange(2 * k, device=device) < k  # only the best k candidates may finish
        self.first_row = torch.arange(n, device=device)[:, None] * k  # (n, 1) each sentence's first row
        # (generated tokens incl. the forced tag) ** length_penalty by step: generate's length normalisation
        self.denoms = torch.tensor(
            [float(prefix_len + s) ** length_penalty for s in range(max_len)], device=device
        )
        self.never_len = float(prefix_len + max_len - 1) ** length_penalty  # "never": judged at the limit
        self._views: dict[str, np.ndarray] = {}
        if host:
            never = rule == "never" and length_penalty > 0  # "never" judges the best live beam at the limit
            self._rule_code = compiled_step().rule_code(rule is True, never)
            self._view_all()

    @property
    def n(self) -> int:
        return self.run_scores.shape[0]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """What :meth:`advance` changes in place (to save and restore around a CUDA graph's warm-up)."""
        return (self.run_scores, self.run_seqs, self.fin_scores, self.fin_seqs, self.fin_any, self.done,
                self.step)  # fmt: skip

    def advance(
        self, row_vals: torch.Tensor, row_toks: torch.Tensor, final: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from each row's best continuations ``row_vals`` / ``row_toks`` (n*k, kk): log-probs
        and vocabulary ids. Returns the tokens (n, k) the live beams continue with and the row (n, k) of
        the previous step each continues. ``final``: the length limit, where every candidate finishes and
        every sentence is done. Updates the state in place (same tensors: a CUDA graph can capture it)."""
        if self.host:
            return self._advance_host(row_vals, row_toks, final)
        n, k, k2, t = self.n, self.k, 2 * self.k, self.max_len
        kk = row_vals.shape[1]
        total = (row_vals.view(n, k, kk) + self.run_scores[:, :, None]).view(n, k * kk)
        cand_scores, flat = torch.topk(total, min(k2, k * kk), dim=-1)  # (n, k2)
        cand_beam = flat // kk  # which live beam each candidate extends
        cand_toks = row_toks.view(n, k * kk).gather(1, flat)  # (n, k2)
        cand_seqs = self.run_seqs.gather(1, cand_beam[:, :, None].expand(-1, -1, t))  # (n, k2, T), a copy
        cand_seqs.index_copy_(2, self.step, cand_toks[:, :, None])
        done_cand = torch.ones_like(cand_toks, dtype=torch.bool) if final else cand_toks == self.eos

        # Finished candidates among the best k enter the pool of finished hypotheses.
        top_k = self.top_k_mask if cand_toks.shape[1] == k2 else self.top_k_mask[: cand_toks.shape[1]]
        new_fin = done_cand & top_k & ~self.done[:, None]
        denom = self.denoms.index_select(0, self.step)  # (1,)
        norm = torch.add(cand_scores / denom, ~new_fin, alpha=_NEG)
        m_scores, sel = torch.topk(torch.cat([self.fin_scores, norm], dim=1), k, dim=1)
        m_seqs = torch.cat([self.fin_seqs, cand_seqs], dim=1)
        self.fin_seqs.copy_(m_seqs.gather(1, sel[:, :, None].expand(-1, -1, t)))
        self.fin_any.copy_(torch.cat([self.fin_any, new_fin], dim=1).gather(1, sel))
        self.fin_scores.copy_(m_scores)

        # The best k unfinished candidates live on (finished ones pushed to the bottom, as in generate).
        live, pick = torch.topk(torch.add(cand_scores, done_cand, alpha=_NEG), k, dim=1)
        self.run_scores.copy_(live)
        torch.gather(cand_seqs, 1, pick[:, :, None].expand(-1, -1, t), out=self.run_seqs)
        if final:
            self.done.fill_(True)
        else:
            # Done when all k slots hold finished hypotheses and (unless the rule is True) the best live
            # beam, normalised at its current length (or at the limit: "never"), is no better than the worst.
            now = self.fin_any.all(dim=1)
            if self.rule is not True:
                best = self.run_scores[:, 0] / (
                    self.never_len if self.rule == "never" and self.lp > 0 else denom
                )
                now &= best <= self.fin_scores.min(dim=1).values
            self.done.logical_or_(now)
        self.step.add_(1)
        rows = self.first_row + cand_beam.gather(1, pick)  # (n, k)
        return cand_toks.gather(1, pick), rows

    def _advance_host(
        self, row_vals: torch.Tensor, row_toks: torch.Tensor, final: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`advance` compiled, on the state's CPU memory (``host_beam_step.advance``): the same float32
        sums, divisions and comparisons as the tensor step, in one call where numpy took ~15 operations and
        torch ~30. Among equal scores the lower index comes first (``torch.topk`` promises no order)."""
        v = self._views
        toks = np.empty((self.n, self.k), dtype=np.int64)
        rows = np.empty((self.n, self.k), dtype=np.int64)
        self.pooled = compiled_step().advance(
            row_vals.numpy(), row_toks.numpy(), v["run_scores"], v["run_seqs"], v["fin_scores"],
            v["fin_seqs"], v["fin_any"], v["done"], v["step"], v["denoms"], self.eos, final, self.pooled,
            self._rule_code, np.float32(self.never_len), toks, rows,
        )  # fmt: skip
        return torch.from_numpy(toks), torch.from_numpy(rows)

    def _view_all(self) -> None:
        """numpy views of the state's tensors (the same memory), for :meth:`_advance_host`."""
        names = ("run_scores", "run_seqs", "fin_scores", "fin_seqs", "fin_any", "done", "step", "denoms")
        self._views = {name: getattr(self, name).numpy() for name in names}

    def keep(self, index: torch.Tensor) -> None:
        """Keep the sentences ``index`` (n',) only, in that order (beam_search drops the done ones)."""
        for name in ("run_scores", "run_seqs", "fin_scores", "fin_seqs", "fin_any", "done"):
            setattr(self, name, getattr(self, name)[index])
        self.first_row = self.first_row[: index.shape[0]]
        if self.host:
            self._view_all()
