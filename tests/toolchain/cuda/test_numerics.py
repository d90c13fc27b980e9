"""The fused functions are numerically right on the llvm target: vs the unfused graph and vs numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from toolchain.cuda import compile as cuda_compile
from toolchain.cuda import numerics, training

from .conftest import compiled


def _gelu(z):
    return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layernorm(x, g, b, eps=1e-12):
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * g + b


FORWARD = {  # numpy forward of each subgraph: (x, params...) -> output
    "layernorm": lambda x, g, b: _layernorm(x, g, b),
    "softmax": lambda x, b: _softmax(x + b),
    "bias-gelu": lambda x, b: _gelu(x + b),
}


def _loss(name, args):
    x, *params, target = [a.astype(np.float64) for a in args]
    return float(np.mean((FORWARD[name](x, *params) - target) ** 2))


@pytest.mark.parametrize("name", ["layernorm", "softmax", "bias-gelu"])
def test_fused_training_step_matches_numpy(name):
    g, c = compiled(name)
    args = g.sample_args(seed=1)
    from toolchain import fusion

    fused = numerics.run(fusion.fuse_groups(c.legalized, c.plan.group_lists, cuda_compile._HostSpec()), args)
    loss, grads = fused[0], fused[1:]
    assert float(loss) == pytest.approx(_loss(name, args), rel=1e-4)
    # gradients by central differences in float64, on a few entries of every parameter
    rng = np.random.default_rng(0)
    for p, grad in enumerate(grads):
        index = g.num_data + p
        for flat in rng.choice(args[index].size, size=4, replace=False):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            h = 1e-3
            plus[index] = plus[index].astype(np.float64)
            minus[index] = minus[index].astype(np.float64)
            plus[index].flat[flat] += h
            minus[index].flat[flat] -= h
            fd = (_loss(name, plus) - _loss(name, minus)) / (2 * h)
            assert grad.flat[flat] == pytest.approx(fd, rel=2e-2, abs=1e-6), (name, p, flat)


@pytest.mark.parametrize("name", ["bert-tiny-block", "mobilenet-v2-block"])
def test_fused_partition_matches_unfused_on_llvm(name):
    g, c = compiled(name)
    result = numerics.check_fused_llvm(c.legalized, c.plan, g.sample_args(seed=2))
    assert result.outputs == 1 + g.num_params
    assert result.ok(atol=1e-5, rtol=1e-5), result


def test_onnx_model_as_training_graph(model_file):
    """--training on an ONNX file: weights become parameters, LayerNormalization is opened, MSE loss appended."""
    import onnx

    from toolchain import onnx_import

    proto = onnx.load(str(model_file("tiny-transformer")))
    inputs = onnx_import.resolve_inputs(proto, {})
    g = training.from_onnx(proto, inputs, "tiny-transformer")
    assert g.num_params >= 4
    legalized = cuda_compile.legalize(g.mod)
    _, _, plan = cuda_compile.plan_graph(legalized)
    assert numerics.check_fused_llvm(legalized, plan, g.sample_args()).ok()
