"""ONNX Runtime sessions as fastvocab's CPU workers run them: the ONNX Runtime engine's (``decoding``) and
the projections' int8 GEMMs' (``kernels.int8``)."""

from __future__ import annotations


def onnx_unavailable(what: str = "engine 'onnx'") -> str | None:
    """None when ONNX Runtime imports and the ``onnx`` package is installed (found, not imported: only an
    export needs it); otherwise why ``what`` cannot run."""
    from importlib.util import find_spec

    try:
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"{what} needs onnxruntime and onnx ({exc})"
    if find_spec("onnx") is None:  # only an export imports it (0.2 s), not a run of a cached graph
        return f"{what} needs onnxruntime and onnx (no module named 'onnx')"
    return None


def one_thread_session(model: str | bytes):
    """An ``onnxruntime.InferenceSession`` of ``model`` (a path, or the serialised graph) on the CPU, on one
    thread and sequential: fastvocab's CPU workers run on one thread each (decisions/0002), and a session
    with no thread pool of its own runs on the calling thread, so a forked worker runs the one it inherited
    (a pool's threads do not survive a fork)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # workers share the cores
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
