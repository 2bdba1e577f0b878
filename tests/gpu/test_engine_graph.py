"""The static engine's fixed-shape decoder step (``StaticDecoder.step_fixed``) on a GPU: no host sync, and
captured once in a CUDA graph, replayed at every position with the same ``h`` as the eager ``step``.

Skipped with a reason without a CUDA GPU. On a GPU machine:

    python -m pytest -q tests/gpu/test_engine_graph.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: captures the decoder step in a CUDA graph",
)

from fastvocab.decoding.static_decoder import StaticDecoder  # noqa: E402
from tests.gpu.common import without_sync  # noqa: E402

DEV = "cuda"
STEPS = 9
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-2, atol=2e-2)}


DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


def model(dtype):
    """The committed demo model (M2M100 family: d 256, 2 decoder layers, 32,108 tokens) on the GPU."""
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(DEMO, local_files_only=True).to(DEV, dtype).eval()


def inputs(m, rows=5, src_len=7):
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, 30_000, (rows, src_len), generator=gen).to(DEV)
    mask = torch.ones_like(src)
    mask[0, -2:] = 0  # some padding in the source
    with torch.inference_mode():
        enc = m.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    tokens = torch.randint(4, 30_000, (rows, STEPS), generator=gen).to(DEV)
    tokens[2, 4] = 1  # a pad token among the targets (position row padding_idx)
    return enc, mask, tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_graph_replay_equals_eager_step(dtype):
    m = model(dtype)
    dec = StaticDecoder(m, capacity=4)
    enc, mask, tokens = inputs(m)
    with torch.inference_mode():
        state = dec.start(enc, mask, capacity=4)
        want = [dec.step(tokens[:, t], state) for t in range(STEPS)]  # the cache grows on the way

        fixed = dec.start(enc, mask, capacity=4)
        dec.prepare_fixed(fixed, STEPS - 1)
        tok = torch.empty(tokens.shape[0], dtype=torch.long, device=DEV)
        pos = torch.zeros(1, dtype=torch.long, device=DEV)
        tok.copy_(tokens[:, 0])
        dec.step_fixed(tok, fixed, pos)  # warm-up (cuBLAS handles) on position 0, rewritten below
        without_sync(lambda: dec.step_fixed(tok, fixed, pos))  # no host read anywhere in the step
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            h = dec.step_fixed(tok, fixed, pos)
            pos.add_(1)
        pos.zero_()
        got = []
        for t in range(STEPS):
            tok.copy_(tokens[:, t])
            graph.replay()
            got.append(h.clone())
    torch.testing.assert_close(torch.stack(got), torch.stack(want), **TOL[dtype])


def test_graphed_greedy_search_equals_eager_on_the_demo_model():
    """The whole greedy step captured (the captured stepper) against the eager search, on the GPU, fp32."""
    from fastvocab.decoding import Seq2SeqAdapter, greedy_search
    from fastvocab.decoding.steppers import CapturedStepper
    from fastvocab.kernels import create_projection

    demo = Seq2SeqAdapter.load(DEMO, device=DEV)
    full = create_projection("full", demo.output_weight, demo.output_bias)
    lines = ["GNU C library: shared libraries", "transitional package", "fast, lightweight web server"]
    batch = demo.encode_texts(lines, "en")
    want = greedy_search(demo, full, batch, "en", "it", max_len=40)
    captured = CapturedStepper(demo, capture=True)
    got = greedy_search(demo, full, batch, "en", "it", max_len=40, stepper=captured)
    assert got == want and any(want)


@pytest.mark.parametrize("rule", [False, True])
def test_graphed_beam_search_equals_eager_on_the_demo_model(rule):
    """The beam step captured in its two graphs (the captured stepper) against the eager search, GPU, fp32."""
    from fastvocab.decoding import Seq2SeqAdapter, beam_search
    from fastvocab.decoding.settings import SearchSettings
    from fastvocab.decoding.steppers import CapturedStepper
    from fastvocab.kernels import create_projection

    demo = Seq2SeqAdapter.load(DEMO, device=DEV)
    full = create_projection("full", demo.output_weight, demo.output_bias)
    lines = ["GNU C library: shared libraries", "transitional package", "fast, lightweight web server"]
    batch = demo.encode_texts(lines, "en")
    settings = SearchSettings(beam=3, max_len=40, early_stopping=rule)
    want = beam_search(demo, full, batch, "en", "it", settings)
    got = beam_search(demo, full, batch, "en", "it", settings, stepper=CapturedStepper(demo, capture=True))
    assert got == want and any(want)


@pytest.mark.parametrize("beam", [1, 2])
def test_translate_with_graphs_equals_eager_on_the_demo_model(beam):
    """``translate(graphs="on")``: batches of different lengths, a graph captured per batch, the same lines
    as the eager translation (GPU, fp32, full projection)."""
    from fastvocab.decoding import Seq2SeqAdapter
    from fastvocab.tasks.projections import make_projection
    from fastvocab.tasks.translate import SearchSettings, translate

    demo = Seq2SeqAdapter.load(DEMO, device=DEV)
    full = make_projection(demo, "full")
    lines = ["GNU C library: shared libraries", "transitional package", "fast, lightweight web server",
             "documentation for the Python interpreter", "", "daemon that monitors disks"]  # fmt: skip
    search = SearchSettings(beam=beam, batch_size=2, max_len=40)
    want = translate(demo, full, lines, "en", "it", search, progress=False).hypotheses
    on = SearchSettings(beam=beam, batch_size=2, max_len=40, graphs="on")
    assert translate(demo, full, lines, "en", "it", on, progress=False).hypotheses == want and any(want)
