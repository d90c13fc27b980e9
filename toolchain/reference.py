"""The numerical reference: onnxruntime on the CPU, at a chosen thread count."""

from __future__ import annotations

import numpy as np
import onnx

from toolchain.errors import VerifyError, first_line


def run_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray], threads: int = 1) -> dict[str, np.ndarray]:
    """Run ``model`` on ``inputs``; returns outputs by name, in graph order."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, inputs)
    except Exception as exc:
        raise VerifyError(f"onnxruntime (the reference) cannot run this model: {first_line(exc)}") from exc
    return dict(zip(names, values))
