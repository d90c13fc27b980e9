"""Shared, cached compilations for the CUDA-path tests (module-scoped: each graph is compiled once)."""

from __future__ import annotations

import functools
import shutil

import pytest


@functools.lru_cache(maxsize=None)
def compiled(name: str):
    """(TrainingGraph, Compiled) for a built-in training graph, fused and stock, for sm_90."""
    from toolchain.cuda import codegen, training
    from toolchain.cuda import compile as cuda_compile

    g = training.builtin(name)
    graph = cuda_compile.Graph(g.name, g.mod, True, g.description)
    return g, cuda_compile.compile_graph(graph, codegen.cuda_target("sm_90"))


def require_nvcc() -> str:
    """nvcc's path, or skip. Never strict (AGOC_STRICT_TOOLS does not apply): CI machines cannot install CUDA."""
    path = shutil.which("nvcc")
    if not path:
        pytest.skip("nvcc not found: the CUDA toolkit is not installed (PTX/cubin checks need it; CI has none)")
    return path
