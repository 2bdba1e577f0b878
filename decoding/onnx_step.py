"""The static decoder's layers run by ONNX Runtime: ``engine="onnx"`` (CPU).

What it changes against :mod:`fastvocab.decoding.static_decoder`: the layers of one step (self-attention,
cross-attention, feed-forward, the norms) are one ONNX Runtime call instead of ~100 torch ops, and with
``--dtype int8`` their linears are ONNX Runtime's dynamic int8 MatMuls (``onnxruntime.quantization``) instead
of fbgemm's. The embedding, the cross-attention keys/values (once per batch), the cache's row selection and
the output projection stay in torch; the encoder's layers are :mod:`fastvocab.decoding.onnx_encoder`'s.

The body is exported once per model (``torch.onnx.export`` of :class:`_Body`, built from the static decoder's
own modules, so every family the static engine runs exports) and cached on disk under
:func:`engine_cache` keyed by the model's fingerprint, the dtype and the versions involved; a later run
loads it. The self-attention cache is torch's, laid out (2, layers, capacity, rows, heads, head_dim) so that
the filled positions ``[:n]`` of a layer are one contiguous block: ONNX Runtime reads them in place (IO
binding on torch's pointers) and writes the new position's key/value straight into ``[n]``; nothing is
copied between the two. The step attends over the ``n`` past positions and the new one as two parts of one
softmax, so the cache is never concatenated.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fastvocab.decoding.cache_memory import allocate_cache
from fastvocab.decoding.inference import step_inference
from fastvocab.kernels.ort_session import one_thread_session, onnx_unavailable

log = logging.getLogger(__name__)

ENGINE_VERSION = "4"  # bump when the exported graph changes: a new cache key


def engine_cache() -> Path:
    """Where exported decoder bodies are kept: ``engines/`` in the cache folder
    (``switches.cache_root``: ``$FASTVOCAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastvocab``, else
    ``~/.cache/fastvocab``)."""
    from fastvocab import switches

    return switches.cache_root() / "engines"


def engine_cache_unusable() -> str | None:
    """None when :func:`engine_cache` exists or can be made, and can be written; otherwise why not (the
    engine then exports into a temporary folder, again on every run)."""
    folder = engine_cache()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot make the engine cache {folder}: {exc}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write the engine cache {folder}"
    return None


class _Body(nn.Module):
    """One step of the static decoder's layers, as exported: inputs ``x`` (rows, d) (embedded), per layer the
    past keys and values (n, rows, heads, hd), the cross keys and values (sources, heads, S, hd) and the
    cross bias (sources, 1, 1, S); outputs ``h`` (rows, d) and per layer the new key and value
    (rows, heads, 1, hd), one cache position."""

    def __init__(self, dec) -> None:
        super().__init__()
        import copy

        from fastvocab.kernels.prepack import unpack_linears

        self.layers = copy.deepcopy(dec.layers)
        unpack_linears(self.layers)  # plain nn.Linear for the exporter (pre-packed ones are oneDNN opaque)
        self.final_ln = dec.final_ln
        self.heads, self.hd = dec.heads, dec.head_dim

    def forward(self, x, bias, past_bias, *kv):
        n_layers = len(self.layers)
        past, cross = kv[: 2 * n_layers], kv[2 * n_layers :]
        new = []
        for i, layer in enumerate(self.layers):
            k_past, v_past, ck, cv = past[2 * i], past[2 * i + 1], cross[2 * i], cross[2 * i + 1]
            if layer.pre_norm:
                a, k, v = self._self_attn(layer, layer.ln_self(x), k_past, v_past, past_bias)
                x = x + a
                x = x + self._cross_attn(layer, layer.ln_cross(x), ck, cv, bias)
                x = x + layer.fc2(layer.act(layer.fc1(layer.ln_ffn(x))))
            else:
                a, k, v = self._self_attn(layer, x, k_past, v_past, past_bias)
                x = layer.ln_self(x + a)
                x = layer.ln_cross(x + self._cross_attn(layer, x, ck, cv, bias))
                x = layer.ln_ffn(x + layer.fc2(layer.act(layer.fc1(x))))
            new += [k, v]
        return (x if self.final_ln is None else self.final_ln(x), *new)

    def _self_attn(self, layer, x, k_past, v_past, past_bias):
        # Shapes by constants and -1 only, so that the graph computes no shapes at run time; q, k and v
        # as (rows, heads, 1, hd), the layout of the matmuls and of a cache position alike, so that no
        # squeeze or unsqueeze runs between them (at one row a node costs more than its work).
        h, hd = self.heads, self.hd
        q, k, v = layer.qkv(x).view(-1, 3 * h, 1, hd).split(h, dim=1)
        past = q @ k_past.permute(1, 2, 3, 0) + past_bias  # (rows, heads, 1, n)
        now = (q * k).sum(-1, keepdim=True)  # (rows, heads, 1, 1)
        p = torch.softmax(torch.cat([past, now], dim=-1), dim=-1)
        o = p[..., :-1] @ v_past.permute(1, 2, 0, 3) + p[..., -1:] * v  # (rows, heads, 1, hd)
        return layer.out_self(o.reshape(-1, h * hd)), k, v

    def _cross_attn(self, layer, x, ck, cv, bias):
        h, hd = self.heads, self.hd
        q = layer.q_cross(x).view(ck.shape[0], -1, h, hd).transpose(1, 2)  # (sources, heads, group, hd)
        att = torch.softmax(q @ ck.transpose(2, 3) + bias, dim=-1)
        return layer.out_cross((att @ cv).transpose(1, 2).reshape(-1, h * hd))


def _versions() -> str:
    import onnxruntime

    return f"torch {torch.__version__} ort {onnxruntime.__version__} engine {ENGINE_VERSION}"


def export_body(dec, path: Path) -> None:
    """Export :class:`_Body` of the static decoder ``dec`` (float32) to ``path``, shapes dynamic."""
    body = _Body(dec).eval()
    rows, src, s, n = 4, 2, 5, 3
    h, hd, layers = dec.heads, dec.head_dim, dec.n_layers
    x = torch.randn(rows, dec.d)
    bias, past_bias = torch.zeros(src, 1, 1, s), torch.zeros(n)
    past = [torch.randn(n, rows, h, hd) for _ in range(2 * layers)]
    cross = [torch.randn(src, h, s, hd) for _ in range(2 * layers)]
    names_past = [f"{kv}_past{i}" for i in range(layers) for kv in "kv"]
    names_cross = [f"{kv}_cross{i}" for i in range(layers) for kv in "kv"]
    names_new = [f"{kv}_new{i}" for i in range(layers) for kv in "kv"]
    dynamic = {"x": {0: "rows"}, "bias": {0: "sources", 3: "S"}, "past_bias": {0: "n"}, "h": {0: "rows"}}
    dynamic.update({name: {0: "n", 1: "rows"} for name in names_past})
    dynamic.update({name: {0: "sources", 2: "S"} for name in names_cross})
    dynamic.update({name: {0: "rows"} for name in names_new})
    inputs = {"x": x, "bias": bias, "past_bias": past_bias, **dict(zip(names_past, past, strict=True))}
    inputs.update(zip(names_cross, cross, strict=True))
    export_graph(body, inputs, ["h", *names_new], dynamic, path)


def export_graph(
    module: nn.Module,
    inputs: dict[str, torch.Tensor],
    outputs: list[str],
    dynamic: dict[str, dict[int, str]],
    path: Path,
) -> None:
    """``module`` called on ``inputs`` (by name, in its argument order) exported to ``path`` (written whole
    or not at all), the axes ``dynamic`` names free."""
    import warnings

    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            tuple(inputs.values()),
            str(tmp),
            input_names=list(inputs),
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )
    tmp.replace(path)


def quantize_body(src: Path, dst: Path) -> None:
    """``src``'s MatMuls as ONNX Runtime dynamic int8 (weights per output channel, signed)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process the model (shape inference) is not needed here
    try:
        quantize_dynamic(str(src), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    tmp.replace(dst)


def graph_path(
    name: str, fingerprint: str, family: str, export: Callable[[Path], None], int8: bool
) -> tuple[Path, float]:
    """The exported graph ``name`` of a model (``{name}.onnx``, float32, or ``{name}-int8.onnx``) in the
    model's cache folder, keyed by its ``fingerprint``, its ``family`` and the versions involved; made now
    when absent (``export(path)`` writes the float32 graph, the int8 one is quantised from it). Returns its
    path and the seconds the export took (0 when found)."""
    key = hashlib.sha256(f"{fingerprint}|{_versions()}|{family}".encode()).hexdigest()[:20]
    folder = engine_cache() / key
    f32, q8 = folder / f"{name}.onnx", folder / f"{name}-int8.onnx"
    path = q8 if int8 else f32
    if path.exists():
        return path, 0.0
    t0 = time.perf_counter()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or absent cache: export for this process only
        import tempfile

        log.warning(
            "engine onnx: cannot cache the export under %s (%s); exporting to a temporary folder", folder, exc
        )
        folder = Path(tempfile.mkdtemp(prefix="fastvocab-onnx-"))
        f32, q8 = folder / f"{name}.onnx", folder / f"{name}-int8.onnx"
        path = q8 if int8 else f32
    if not f32.exists():
        export(f32)
    if int8:
        quantize_body(f32, q8)
    spent = time.perf_counter() - t0
    log.info("engine onnx: exported the %s graph to %s in %.1f s (once per model)", name, path, spent)
    return path, spent


class Session:
    """One exported graph's ONNX Runtime session, opened at first use (:meth:`get`). A forked worker runs
    the one it inherited: with one thread and sequential execution a run stays on the calling thread, which
    fork keeps, and the session keeps what its earlier runs planned for the shapes they saw; opening its own
    cost each worker ~15 ms and that planning again at every first shape."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._held = None  # (pid that opened it, InferenceSession)

    def get(self):
        if self._held is None:
            self._held = (os.getpid(), one_thread_session(str(self.path)))
        return self._held[1]

    def reopen(self, path: Path | None = None) -> None:
        """Open the session again at next use, of ``path`` when given."""
        if self._held is not None and self._held[0] != os.getpid():
            _keep_forever(self._held[1])
        self._held = None
        if path is not None:
            self.path = path


@dataclass
class _Layout:
    """Each layer's past, new position and cross keys/values as the body binds them: by address within the
    two caches (contiguous, (2, layers, ...)), no torch view made for them (at one row a step's views and
    its Python cost as much as the body's run). ``cross``: (name, address, shape) of the cross inputs and
    the bias; ``blocks``: (past name, new name, address of position 0) per layer and key/value; a position
    is ``pos_shape`` (rows, heads, hd), ``per_pos`` bytes, and the body writes it as ``new_shape``
    (rows, heads, 1, hd)."""

    key: tuple
    cross: list[tuple[str, int, list[int]]]
    blocks: list[tuple[str, str, int]]
    pos_shape: list[int]
    new_shape: list[int]
    per_pos: int

    @classmethod
    def of(cls, key: tuple, kv: torch.Tensor, cross: torch.Tensor, bias: torch.Tensor) -> _Layout:
        assert kv.is_contiguous() and cross.is_contiguous() and bias.is_contiguous()
        layers, capacity = kv.shape[1], kv.shape[2]
        pos_shape, cross_shape = list(kv.shape[3:]), list(cross.shape[2:])
        per_pos, per_cross = 4 * math.prod(pos_shape), 4 * math.prod(cross_shape)
        at, cross_at = kv.data_ptr(), cross.data_ptr()
        binds, blocks = [("bias", bias.data_ptr(), list(bias.shape))], []
        for i in range(layers):
            for j, name in enumerate("kv"):
                block = j * layers + i  # [j, i] in the (2, layers, ...) layout
                binds.append((f"{name}_cross{i}", cross_at + block * per_cross, cross_shape))
                blocks.append((f"{name}_past{i}", f"{name}_new{i}", at + block * capacity * per_pos))
        rows, heads, hd = pos_shape
        return cls(key, binds, blocks, pos_shape, [rows, heads, 1, hd], per_pos)


@dataclass
class OnnxState:
    """Decoder state of the onnx engine: ``self_kv`` (2, layers, capacity, rows, heads, hd), the first
    ``rows`` rows' worth of ``buffer`` (flat) viewed in that layout; ``spare`` a flat buffer a reorder
    gathers into; cross keys/values and bias as the static engine's (``StaticState``).

    After a beam step's reorder a row's cache may stay where it was (:meth:`OnnxDecoder.reorder`): ``at``
    (rows,) is then the cache row of each of the search's rows and ``order`` its inverse, the search's row
    in each cache row, both int64 arrays on the host; None while they are the same."""

    self_kv: torch.Tensor
    cross_kv: torch.Tensor
    cross_bias: torch.Tensor
    group: int
    length: int
    buffer: torch.Tensor
    spare: torch.Tensor | None = None
    _layout: _Layout | None = None
    at: np.ndarray | None = None
    order: np.ndarray | None = None

    def layout(self) -> _Layout:
        """Where the body's cache inputs and outputs lie (:class:`_Layout`), made again when a cache moved."""
        kv, cross, bias = self.self_kv, self.cross_kv, self.cross_bias
        key = (kv.data_ptr(), cross.data_ptr(), bias.data_ptr(), kv.shape, cross.shape, bias.shape)
        if self._layout is None or self._layout.key != key:
            self._layout = _Layout.of(key, kv, cross, bias)
        return self._layout

    @property
    def rows(self) -> int:
        return self.self_kv.shape[3]

    @property
    def capacity(self) -> int:
        return self.self_kv.shape[2]

    def cache_bytes(self) -> int:
        held = [self.buffer, self.cross_kv, self.cross_bias, self.spare]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


class OnnxDecoder:
    """The static decoder ``dec`` (float32, CPU) with its layers run by ONNX Runtime; the same interface
    (``start``, ``step``, ``reorder``) and the same ``h`` up to float rounding. ``int8``: the body's int8
    export (:meth:`use_int8`)."""

    def __init__(self, dec, fingerprint: str | Callable[[], str]) -> None:
        reason = onnx_unavailable()
        if reason:
            raise ValueError(reason)
        if dec.device.type != "cpu" or dec.dtype != torch.float32:
            raise ValueError(f"engine 'onnx' runs float32 on CPU; the model is {dec.dtype} on {dec.device}")
        self.dec = dec
        self.fingerprint = fingerprint if isinstance(fingerprint, str) else fingerprint()
        self.int8 = False
        self._bindings = threading.local()  # .held: this thread's _Bindings
        self._zeros = torch.zeros(256)
        path, self.export_seconds = self._graph(int8=False)
        self.session = Session(path)

    def use_int8(self) -> None:
        """Run the int8 export of the body from now on (exported once, cached)."""
        path, spent = self._graph(int8=True)
        self.export_seconds += spent
        self.int8 = True
        self.session.reopen(path)
        self._bindings = threading.local()

    def _graph(self, int8: bool) -> tuple[Path, float]:
        export = lambda path: export_body(self.dec, path)  # noqa: E731
        return graph_path("body", self.fingerprint, self.dec.family.name, export, int8)

    @property
    def path(self) -> Path:
        return self.session.path

    def quantize_int8(self) -> None:
        """``--dtype int8``: the body's int8 export, and the cross-attention K/V GEMM (in torch, once per
        batch) as the static engine quantises it."""
        from fastvocab.kernels.int8 import quantize_linears

        self.use_int8()
        self.dec.cross_kv = quantize_linears(nn.Sequential(self.dec.cross_kv))[0]
        self.dec.layers = nn.ModuleList()  # the body runs them now; their float32 weights are not needed

    def __getattr__(self, name: str):  # what the adapter and benchmarks read of a StaticDecoder
        if name in ("dtype", "device", "n_layers", "heads", "head_dim", "d", "cache_bytes_per_row", "family"):
            return getattr(self.dec, name)
        if name in ("step_fixed", "prepare_fixed"):
            raise AttributeError(
                f"engine 'onnx' has no fixed-shape step ({name}): --graphs on needs 'static'"
            )
        raise AttributeError(name)

    def bindings(self) -> _Bindings:
        """This thread's IO binding for the session, kept from step to step (a new one for a new session).
        One per thread: ``translate``'s worker threads step their batches through one session at once."""
        sess = self.session.get()
        held = getattr(self._bindings, "held", None)
        if held is None or held.session is not sess:
            held = self._bindings.held = _Bindings(sess)
        return held

    # ------------------------------------------------------------------ state

    def start(self, enc_hidden: torch.Tensor, enc_mask: torch.Tensor, capacity: int | None = None):
        st = self.dec.start(enc_hidden, enc_mask, capacity=1)  # cross K/V and bias, a 1-position cache
        cap = int(capacity or self.dec.capacity)
        rows = st.cross_kv.shape[2]
        flat = self._alloc(rows, cap)
        kv = self._view(flat, rows, cap)
        kv[:, :, 0].zero_()  # the first step reads position 0 as a masked past (see step)
        return OnnxState(kv, st.cross_kv, st.cross_bias, 1, 0, flat)

    def _shape(self, rows: int, cap: int) -> tuple[int, ...]:
        d = self.dec
        return (2, d.n_layers, cap, rows, d.heads, d.head_dim)

    def _alloc(self, rows: int, cap: int) -> torch.Tensor:
        numel = int(np.prod(self._shape(rows, cap)))
        return allocate_cache(
            (numel,), self.dtype, self.device, self.dec.max_cache_bytes, "self-attention cache"
        )

    def _view(self, flat: torch.Tensor, rows: int, cap: int) -> torch.Tensor:
        shape = self._shape(rows, cap)
        return flat[: int(np.prod(shape))].view(shape)

    def _grow(self, state: OnnxState) -> None:
        rows, cap, n = state.rows, 2 * state.capacity, state.length
        flat = self._alloc(rows, cap)
        kv = self._view(flat, rows, cap)
        kv[:, :, :n].copy_(state.self_kv[:, :, :n])
        state.self_kv, state.buffer, state.spare = kv, flat, None

    @step_inference
    def reorder(self, state: OnnxState, index: torch.Tensor, group: int | None = None) -> OnnxState:
        """As ``StaticDecoder.reorder``: rows ``index`` in that order, into the spare buffer (which swaps);
        a beam step's reorder (the same rows and groups) moves only what it must (:meth:`_follow`)."""
        n, rows, cap = state.length, index.shape[0], state.capacity
        if state.at is not None:  # the cache rows of the rows asked for
            index = torch.from_numpy(state.at[index.numpy()])
        if group is not None and group == state.group > 1 and rows == state.rows:
            return self._follow(state, index)
        spare = state.spare
        if spare is None or spare.numel() < int(np.prod(self._shape(rows, cap))):
            spare = self._alloc(rows, cap)
        kv = self._view(spare, rows, cap)
        torch.index_select(state.self_kv[:, :, :n], 3, index, out=kv[:, :, :n])
        g_old = state.group
        if group is not None and rows % group == 0:
            sources = index[::group] // g_old
            cross, bias = state.cross_kv, state.cross_bias
            if sources.shape[0] != cross.shape[2]:
                cross, bias = cross.index_select(2, sources), bias.index_select(0, sources)
            return OnnxState(kv, cross, bias, group, n, spare, state.buffer)
        sources = index // g_old if g_old > 1 else index
        cross = state.cross_kv.index_select(2, sources)
        return OnnxState(kv, cross, state.cross_bias.index_select(0, sources), 1, n, spare, state.buffer)

    @staticmethod
    def _follow(state: OnnxState, parents: torch.Tensor) -> OnnxState:
        """A beam step's reorder without moving the cache: each row continues in its parent's cache row
        (``parents``, cache rows); a parent's second and later children take the cache rows of their
        sentence that no row continues, and only their past is copied there. A full reorder copies every
        row's past every step, which at batch 32 x beam 4 was 14% of a one-thread run (a probe)."""
        rows, group, n = state.rows, state.group, state.length
        taken, at, extra = [False] * rows, parents.tolist(), []
        for i, p in enumerate(at):
            if taken[p]:
                extra.append(i)
            taken[p] = True
        if extra:
            free: dict[int, list[int]] = {}  # a sentence's cache rows that no row continues
            for r in range(rows):
                if not taken[r]:
                    free.setdefault(r // group, []).append(r)
            past = state.self_kv[:, :, :n].numpy()
            for i in extra:  # row by row, in numpy: a torch copy_ costs ~5x its work at a few positions
                r = free[i // group].pop()
                past[:, :, :, r] = past[:, :, :, at[i]]
                at[i] = r
        where = order = None
        if at != list(range(rows)):
            where = np.array(at)
            order = np.argsort(where)  # ``at`` is a permutation: its inverse
        return OnnxState(state.self_kv, state.cross_kv, state.cross_bias, group, n, state.buffer, state.spare,
                         state._layout, where, order)  # fmt: skip

    # ------------------------------------------------------------------ step

    @step_inference
    def step(self, tokens: torch.Tensor, state: OnnxState) -> torch.Tensor:
        """Feed one token per row (rows,); returns ``h`` (rows, d) and advances ``state`` in place."""
        dec, pos = self.dec, state.length
        if pos >= state.capacity:
            self._grow(state)
        if state.order is not None:  # each cache row's token (numpy: a step's few rows)
            tokens = torch.from_numpy(tokens.numpy()[state.order])
        x = dec.embed(tokens, pos).contiguous()
        h = torch.empty_like(x)
        io = self.bindings()
        io.input("x", x)
        io.output("h", h)
        # No zero-sized past: the first step reads position 0 (zeroed by start, where its own key/value
        # go) as one past position weighted exp(min - max) = 0.
        n = max(pos, 1)
        past_bias = self._past_bias(n, masked=pos == 0)  # held until the run: ORT reads its memory then
        io.input("past_bias", past_bias)
        layout = state.layout()
        for name, address, shape in layout.cross:  # the same from step to step: not bound again
            io.input_at(name, address, shape)
        past_shape, new_shape, per_pos = [n, *layout.pos_shape], layout.new_shape, layout.per_pos
        for past_name, new_name, past in layout.blocks:
            io.input_at(past_name, past, past_shape)
            io.output_at(new_name, past + pos * per_pos, new_shape)
        io.run()
        state.length = pos + 1
        return h if state.at is None else torch.from_numpy(h.numpy()[state.at])

    def _past_bias(self, n: int, masked: bool) -> torch.Tensor:
        if masked:
            return torch.full((1,), torch.finfo(self.dtype).min)
        if self._zeros.shape[0] < n:
            self._zeros = torch.zeros(2 * n)
        return self._zeros[:n]


def _keep_forever(session) -> None:
    """A session inherited through fork (``translate``'s forked workers) is never freed in the child: its
    destructor waits on the parent's thread-pool condition variables, whose waiters do not exist here, and
    would hang the worker. One reference more, never released."""
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(session))


class _Bindings:
    """A session's IO binding at the level of ONNX Runtime's C++ binding (``SessionIOBinding``): torch
    tensors bound in place by pointer, and a name whose pointer and shape are those already bound is not
    bound again (the cross-attention keys and values stay the same from step to step). The public
    ``IOBinding`` wrapper makes an ``OrtDevice`` and checks graph capture at every call, which cost
    ~130 us a step at one row, more than half of the body's own run (docs/cpu-engine.md, 0011). Built on the
    pinned ``onnxruntime`` (requirements.txt); the engine's tests run every path."""

    def __init__(self, session) -> None:
        from onnxruntime.capi import _pybind_state as C
        from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

        self.session = session
        self._run = session._sess.run_with_iobinding
        self._io = C.SessionIOBinding(session._sess)
        self._cpu = OrtDevice.make("cpu", 0)._get_c_device()
        self._bound: dict[str, tuple[int, list[int]]] = {}

    def input(self, name: str, t: torch.Tensor) -> None:
        """Bind ``t`` (contiguous, CPU, float32) to input ``name`` in place: ONNX Runtime reads its memory
        when the session runs, so the caller keeps it alive until then."""
        assert t.is_contiguous() and t.dtype == torch.float32, name
        self.input_at(name, t.data_ptr(), list(t.shape))

    def output(self, name: str, t: torch.Tensor) -> None:
        """Bind ``t`` to output ``name``: the run writes into its memory."""
        assert t.is_contiguous() and t.dtype == torch.float32, name
        self.output_at(name, t.data_ptr(), list(t.shape))

    def input_at(self, name: str, address: int, shape: list[int]) -> None:
        """Bind the float32 array of ``shape`` at ``address`` to input ``name``."""
        self._at(self._io.bind_input, name, address, shape)

    def output_at(self, name: str, address: int, shape: list[int]) -> None:
        """Bind the float32 array of ``shape`` at ``address`` to output ``name``."""
        self._at(self._io.bind_output, name, address, shape)

    def _at(self, bind, name: str, address: int, shape: list[int]) -> None:
        if self._bound.get(name) != (address, shape):
            bind(name, self._cpu, np.float32, shape, address)
            self._bound[name] = (address, shape)

    def run(self) -> None:
        self._run(self._io, None)
