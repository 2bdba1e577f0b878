"""Dynamic int8 linear layers on CPU: the projections' ``int8`` option and the decoder's int8 mode.

``torch.ao.quantization.quantize_dynamic`` stores each ``nn.Linear`` weight as int8 (one scale per output
channel, finer than one per tensor) and quantises the activations per call (fbgemm GEMMs), as CTranslate2's
``compute_type="int8"`` does on CPU. ``torch.ao.quantization`` is deprecated in favour of torchao but still
shipped with the pinned torch; its deprecation warnings are silenced here, nothing else in the environment
offers dynamic int8 GEMMs. It sits apart from the projections so that the model adapter (``decoding``) can
quantise the decoder's and the encoder's linears with it without importing a projection.

A dynamic int8 linear quantises its input per call, per tensor, to unsigned 7-bit integers (``reduce_range``:
fbgemm's AVX2 kernels add pairs of u8 x s8 products in int16, which 8 bits could saturate), multiplies in
int32 and scales back to float32. :func:`quantize_input` reproduces that quantisation, so a kernel that
multiplies some of the layer's rows on its own (the clustered projection's gathers, ``torch._int_mm``)
computes the same integers and the same logits.

fbgemm's GEMM is called from TorchScript (:func:`linear_packed`, :func:`linear_packed_many` and the layers,
:class:`Int8Linear`): called from Python, receiving the packed weights cost more than a step's GEMM.

Rows packed once (:func:`packed_rows`, :func:`packed_of`) run through fbgemm's packed GEMM. Those that serve
steps of many rows may also run on ONNX Runtime's int8 GEMM (MLAS), fed the input quantised as fbgemm
quantises it: the same int32 sums, the same logits (:class:`PackedRows`, :func:`ort_int8`).
"""

from __future__ import annotations

import copy
import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar, cast

import numpy as np
import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from fastvocab import switches
from fastvocab.kernels.ort_session import one_thread_session, onnx_unavailable

M = TypeVar("M", bound=nn.Module)

log = logging.getLogger(__name__)


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.ao")
    warnings.filterwarnings("ignore", message=r".*deprecated.*", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
    return ctx


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """``W`` (N, d) and ``b`` as a dynamic int8 ``nn.Linear`` (CPU only): int8 per output row, symmetric."""
    if weight.device.type != "cpu":
        raise ValueError(f"int8 projection runs on CPU only, W is on {weight.device}")
    n_vocab, d = weight.shape
    # A 1 x 1 layer given W's own tensors: no random init of N x d weights that are overwritten at once, no
    # copy (quantising only reads them). Not nn.utils.skip_init: its first call in a process sets up the
    # meta device, 0.4 s of a clustered int8 map's set-up on 2 cores.
    lin = nn.Linear(1, 1, bias=bias is not None)
    lin.in_features, lin.out_features = d, n_vocab
    lin.weight = nn.Parameter(weight.detach().float(), requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias.detach().float(), requires_grad=False)
    return quantize_linears(nn.Sequential(lin), inplace=True)[0]


def int8_rows(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 weight of a layer from :func:`int8_linear`, unpacked: (N, d) int8 and the (N,) float32 row
    scales the layer multiplies by (its zero points are 0: the weights are symmetric)."""
    qw = layer.weight()  # type: ignore[operator]  # a dynamic int8 Linear unpacks its weight in a method
    if qw.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric):
        raise ValueError(f"expected int8 weights per output row, got {qw.qscheme()}")
    if bool(qw.q_per_channel_zero_points().any()):
        raise ValueError("expected symmetric int8 weights (zero points 0)")
    return qw.int_repr().contiguous(), qw.q_per_channel_scales().float()


# Rows packed for many-row steps run a step of ORT_MIN_ROWS rows or more on ONNX Runtime's int8 GEMM (MLAS)
# where :func:`ort_at` says so for their width (by default the machine's probe). On one thread of a 2-core
# Xeon with AMX, over 4,096-column blocks back to back, fbgemm took 1.28-1.49x MLAS's time at d 1024 from 8
# to 64 rows, and 0.84-1.08x at d 256; 16 rows leave a margin for MLAS's cost per call, which grows in share
# as rows shrink (docs/decisions/0019-int8-gemms-on-onnx-runtime.md).
ORT_MIN_ROWS = 16


@functools.lru_cache(maxsize=1)
def ort_int8() -> bool:
    """Whether rows packed for many-row steps may run those steps on ONNX Runtime: as ``FASTVOCAB_INT8_GEMM``
    (``switches.INT8_GEMM``) says (``fbgemm``, ``onnxruntime``), or with ``auto`` (the default) where ONNX
    Runtime is installed; which rows do is :func:`ort_at`'s answer. Kept for the process
    (``ort_int8.cache_clear()`` asks again)."""
    choice = switches.INT8_GEMM.get()
    if choice == "fbgemm":
        return False
    missing = onnx_unavailable(f"{switches.INT8_GEMM.env}=onnxruntime")
    if choice == "onnxruntime" and missing:
        raise ValueError(missing)
    return not missing


@functools.cache
def ort_at(d: int) -> bool:
    """Whether rows of width ``d`` packed for many-row steps run them on ONNX Runtime (MLAS). With
    ``FASTVOCAB_INT8_GEMM=onnxruntime``, from ``switches.ORT_MIN_DIM`` wide; with ``auto``, where the
    machine's probe (``kernels.gemm_probe``: both kernels timed once per machine and width, the answer kept
    in the cache folder) found MLAS faster. Kept for the process per width."""
    if not ort_int8():
        return False
    if switches.INT8_GEMM.get() == "onnxruntime":
        return d >= switches.ORT_MIN_DIM.get()
    return _probed(d).choice == "onnxruntime"


@functools.cache
def _probed(d: int):
    """The machine's probe at width ``d``, once per process: what :func:`ort_at` decides by and
    :func:`many_rows_gemm` names (a probe not kept on disk would otherwise be measured again, and could
    answer otherwise)."""
    from fastvocab.kernels.gemm_probe import probe

    found = probe(d, probe_kernels)
    log.debug("int8 GEMM of one-thread steps of %d rows or more: %s", ORT_MIN_ROWS, found.describe())
    return found


def probe_kernels(d: int, rows: int, columns: int, blocks: int) -> dict[str, Callable[[], object]]:
    """The two int8 GEMMs ``kernels.gemm_probe`` times: ``rows`` random rows of width ``d`` through
    ``blocks`` random blocks of ``columns`` int8 rows each, on fbgemm and on ONNX Runtime."""
    g = torch.Generator().manual_seed(0)
    packed = []
    for _ in range(blocks):
        q = torch.randint(-127, 128, (columns, d), dtype=torch.int8, generator=g)
        scale = torch.rand(columns, generator=g) * 0.01 + 1e-3
        packed.append(packed_rows(q, scale, torch.zeros(columns)))
    sessions = [ort_session_of(p) for p in packed]
    x = torch.randn(rows, d, generator=g)
    return {
        "fbgemm": lambda: [fbgemm_logits(x, p) for p in packed],
        "onnxruntime": lambda: [ort_logits(x, s) for s in sessions],
    }


def many_rows_gemm(d: int | None = None) -> str:
    """The int8 GEMM of one-thread steps of many rows, as benchmark records name it: at width ``d``, which
    one and why (:func:`ort_at`); without ``d``, the rule."""
    if not ort_int8():
        return "fbgemm"
    if switches.INT8_GEMM.get() == "onnxruntime":
        return f"onnxruntime from {ORT_MIN_ROWS} rows at d >= {switches.ORT_MIN_DIM.get()}"
    if d is None:
        return f"from {ORT_MIN_ROWS} rows, the faster of onnxruntime and fbgemm by this machine's probe"
    return f"from {ORT_MIN_ROWS} rows, {_probed(d).describe()}"


class PackedRows:
    """int8 rows (n, ``d``) with their scales and bias, packed once for fbgemm (``quantized.linear_dynamic``).
    With ``many_rows`` (where :func:`ort_at` ``d``: ``on_ort``) one-thread steps of ``ORT_MIN_ROWS`` rows or
    more run them on ONNX Runtime: ``session``, over the rows packed for MLAS (n d bytes more), opened at its
    first use (:func:`~fastvocab.kernels.ort_session.one_thread_session`). Building the session's graph
    imports the ``onnx`` package, most of a one-line translate's 1.48 s set-up on a 2-core Xeon (0.61 s
    without it: docs/cpu-engine.md, 0029), which a job whose steps never reach that many rows (a one-line
    translate, batch 1) does not pay; a decode pool opens the sessions a job will use before it forks
    (:func:`open_sessions`), and the workers run the ones they inherit."""

    def __init__(self, fbgemm: torch.ScriptObject, d: int, many_rows: bool = False) -> None:
        self.fbgemm = fbgemm
        self.on_ort = bool(many_rows and ort_at(d))
        self._session = None

    @property
    def session(self):
        """The ONNX Runtime session (opened now if not yet), or None where the rows are not ``on_ort``."""
        if self.on_ort and self._session is None:
            self._session = ort_session_of(self)  # two threads may both open one: either is kept
        return self._session

    @session.setter
    def session(self, session) -> None:
        self._session = session


def open_sessions(packed: Iterable[PackedRows | None], rows: int) -> None:
    """Open now the sessions of ``packed`` that steps of up to ``rows`` rows would open at first use."""
    if rows >= ORT_MIN_ROWS:
        for p in packed:
            if p is not None:
                p.session  # noqa: B018  # the property opens it


def ort_session_of(packed: PackedRows):
    """An ONNX Runtime session of ``MatMulIntegerToFloat`` over the fbgemm-packed rows ``packed``: inputs
    ``a`` (rows, d) uint8, ``a_scale`` and ``a_zero`` (the input quantised as fbgemm quantises it); output
    ``y`` (rows, n) float32, the rows' scales and bias applied."""
    from onnx import TensorProto, helper, numpy_helper

    w, bias = torch.ops.quantized.linear_unpack(packed.fbgemm)
    n, d = w.shape
    inits = [
        numpy_helper.from_array(np.ascontiguousarray(w.int_repr().numpy().T), "w"),  # (d, n) int8
        numpy_helper.from_array(w.q_per_channel_scales().float().numpy(), "w_scale"),
    ]
    inputs = ["a", "w", "a_scale", "w_scale", "a_zero"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.detach().float().numpy(), "bias"))
        inputs += ["", "bias"]  # no weight zero points: symmetric
    node = helper.make_node("MatMulIntegerToFloat", inputs, ["y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        "int8_rows",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, ["rows", d]),
            helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("a_zero", TensorProto.UINT8, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    return one_thread_session(model.SerializeToString())


def packed_rows(
    q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, *, many_rows: bool = False
) -> PackedRows:
    """Rows ``q`` (n, d) int8 with their scales (n,) packed for ``quantized.linear_dynamic`` (fbgemm), as a
    layer from :func:`int8_linear` holds its own: :func:`linear_packed` on them gives that layer's logits.
    ``many_rows``: they serve steps of many rows (:class:`PackedRows`)."""
    ctx = _quiet()
    try:
        zero = torch.zeros(q.shape[0], dtype=torch.int64)
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
        return PackedRows(torch.ops.quantized.linear_prepack(qw, bias), q.shape[1], many_rows)
    finally:
        ctx.__exit__(None, None, None)


def linear_packed(x: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """``x`` (rows, d) float32 through rows packed by :func:`packed_rows` (or :func:`packed_of` a layer),
    (rows, n) float32: on ONNX Runtime from ``ORT_MIN_ROWS`` rows on one thread when they serve many rows
    (:class:`PackedRows`), else fbgemm (which runs on this process's threads)."""
    if packed.on_ort and _many_rows(x):
        return ort_logits(x, packed.session)
    return fbgemm_logits(x, packed)


def fbgemm_logits(x: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """``x`` (rows, d) float32 through ``packed`` on fbgemm, (rows, n) float32."""
    return _fbgemm_calls()[0](x, packed.fbgemm)


def ort_logits(x: torch.Tensor, session) -> torch.Tensor:
    """``x`` (rows, d) float32 through a session of :func:`ort_session_of`, (rows, n) float32: the input
    quantised as fbgemm quantises it (unsigned 7 bits), so both sum the same integers."""
    qx = torch.quantize_per_tensor_dynamic(x.contiguous(), torch.quint8, reduce_range=True)
    feeds = {
        "a": qx.int_repr().numpy(),
        "a_scale": np.array(qx.q_scale(), dtype=np.float32),
        "a_zero": np.array(qx.q_zero_point(), dtype=np.uint8),
    }
    return torch.from_numpy(session.run(None, feeds)[0])


def linear_packed_many(x: torch.Tensor, packed: Sequence[PackedRows]) -> list[torch.Tensor]:
    """``x`` through each of several packed row sets, as :func:`linear_packed` on each, in one call from
    Python where all run on fbgemm: a step's cached cluster blocks and its batch's columns."""
    if _many_rows(x) and any(p.on_ort for p in packed):
        return [linear_packed(x, p) for p in packed]
    return _fbgemm_calls()[1](x, [p.fbgemm for p in packed])


def _many_rows(x: torch.Tensor) -> bool:
    """Whether rows packed with a session run ``x`` on it: ``ORT_MIN_ROWS`` rows or more, on one thread."""
    return x.shape[0] >= ORT_MIN_ROWS and torch.get_num_threads() == 1


# TorchScript reads the packed weights' type from the annotations; mypy does not know torch.classes' names.
def _fbgemm_one(
    x: torch.Tensor,
    packed: torch.classes.quantized.LinearPackedParamsBase,  # type: ignore[name-defined]
) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, packed, True)  # reduce_range, as the layers


def _fbgemm_each(
    x: torch.Tensor,
    packed: list[torch.classes.quantized.LinearPackedParamsBase],  # type: ignore[name-defined]
) -> list[torch.Tensor]:
    return [torch.ops.quantized.linear_dynamic(x, p, True) for p in packed]


@functools.lru_cache(maxsize=1)
def _fbgemm_calls() -> tuple[Callable, Callable]:
    """:func:`_fbgemm_one` and :func:`_fbgemm_each` compiled by TorchScript, which passes the packed
    weights to the op in C++. Called from Python, the op takes ~20 us more a call to receive them than its
    GEMM at a step's few rows takes (4 x 256 x 300 on one thread of a Xeon: ~25 us from Python, ~11 from
    TorchScript, ~3-5 a further call inside one; docs/decisions/0024-fbgemm-from-torchscript.md). Where
    TorchScript is gone, the op is called from Python: the same op, the same logits."""
    ctx = _quiet()
    warnings.filterwarnings(
        "ignore", message=r".*torch\.jit\.script.* is deprecated", category=DeprecationWarning
    )
    try:
        return _unoptimised(torch.jit.script(_fbgemm_one)), _unoptimised(torch.jit.script(_fbgemm_each))
    except Exception:  # deprecated: a torch without TorchScript still runs the op
        return _fbgemm_one, _fbgemm_each
    finally:
        ctx.__exit__(None, None, None)


def _unoptimised(compiled: Callable) -> Callable:
    """``compiled`` run by TorchScript's plain executor. The optimising one, the default, compiles a plan at
    a process's first call (45-80 ms on the Xeon, in every forked worker) that one op does not need; the
    plain one took 1 ms. The flag is the calling thread's, set back after each call."""
    get, put = torch._C._get_graph_executor_optimize, torch._C._set_graph_executor_optimize

    def call(*args):
        was = get()
        put(False)
        try:
            return compiled(*args)
        finally:
            put(was)

    call.__wrapped__ = compiled  # type: ignore[attr-defined]
    return call


def packed_of(layer: nn.Module, *, many_rows: bool = False) -> PackedRows:
    """The packed weight and bias of a layer from :func:`int8_linear`, for :func:`linear_packed` (the same
    logits as calling the layer, without the module call); ``many_rows`` as :func:`packed_rows`."""
    params = cast(nn.Module, layer._packed_params)  # a dynamic int8 Linear's LinearPackedParams
    d = cast(int, layer.in_features)
    return PackedRows(cast(torch.ScriptObject, params._packed_params), d, many_rows)


def quantize_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (rows, d) as a dynamic int8 linear quantises it (one scale for the tensor, unsigned 7 bits):
    the integers less their zero point, as float32 (exact), and the scale, a 0-d float32 tensor."""
    qx = torch.quantize_per_tensor_dynamic(x.float().contiguous(), torch.quint8, reduce_range=True)
    ints = qx.int_repr().float() - qx.q_zero_point()
    return ints, torch.tensor(qx.q_scale(), dtype=torch.float32)


def quantize_linears(module: M, inplace: bool = False) -> M:
    """A copy of ``module`` (``module`` itself with ``inplace``) whose ``nn.Linear`` layers are dynamic int8
    (per-channel weight scales)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    ctx = _quiet()
    try:
        target = module if inplace else copy.deepcopy(module)
        return quantize_dynamic(
            target,
            {nn.Linear: per_channel_dynamic_qconfig},
            dtype=torch.qint8,
            mapping={nn.Linear: Int8Linear},
            inplace=True,
        )
    finally:
        ctx.__exit__(None, None, None)


class Int8Linear(DynamicLinear):
    """torch's dynamic int8 ``Linear`` whose call runs the op as :func:`linear_packed` does (from
    TorchScript: ~20 us less a call at a step's few rows), the same op and arguments, the same output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _fbgemm_calls()[0](x, self._packed_params._packed_params)
