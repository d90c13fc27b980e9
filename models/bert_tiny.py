"""BERT-tiny (L=2, H=128, A=2) as an inference ONNX graph with random weights.

Architecture: Devlin et al., "BERT" (NAACL 2019) at the size of Turc et al.,
"Well-Read Students Learn Better" (2019), released as
``google/bert_uncased_L-2_H-128_A-2``: vocabulary 30522, 512 positions,
2 token types, 2 post-norm encoder layers with hidden size 128, 2 attention
heads of 64, feed-forward size 512 with erf-GELU, LayerNorm eps 1e-12, as in
Hugging Face ``BertModel``.

Input: ``input_ids`` int64 [N, S] (S <= 512) only. The attention mask is taken
as all ones (no masking term) and ``token_type_ids`` as all zeros (a constant
Gather of token type 0); position ids are the constant 0..S-1.

Output: ``output`` = ``BertModel``'s ``pooler_output``, tanh(W h[CLS] + b),
float32 [N, 128]. With the pooler the parameter count is exactly
``BertModel``'s: 4,385,920.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from models.builder import GraphBuilder

VOCAB = 30522
MAX_POSITIONS = 512
TYPE_VOCAB = 2
HIDDEN = 128
LAYERS = 2
HEADS = 2
INTERMEDIATE = 512
LN_EPS = 1e-12
SEED = 6


def _attention(g: GraphBuilder, x: str, n: int, s: int, name: str) -> str:
    d = HIDDEN // HEADS

    def heads(t: str, perm: tuple[int, ...], tag: str) -> str:
        t = g.reshape(t, (n, s, HEADS, d), name=f"{name}_{tag}_reshape")
        return g.transpose(t, perm, name=f"{name}_{tag}_transpose")

    q = heads(g.linear(x, HIDDEN, HIDDEN, name=f"{name}_query"), (0, 2, 1, 3), "query")  # [n, h, s, d]
    k = heads(g.linear(x, HIDDEN, HIDDEN, name=f"{name}_key"), (0, 2, 3, 1), "key")  # [n, h, d, s]
    v = heads(g.linear(x, HIDDEN, HIDDEN, name=f"{name}_value"), (0, 2, 1, 3), "value")  # [n, h, s, d]
    scores = g.op("MatMul", [q, k], f"{name}_scores")
    scores = g.op("Div", [scores, g.const("sqrt_head_dim", math.sqrt(d))], f"{name}_scores_scaled")
    probs = g.op("Softmax", [scores], f"{name}_probs", axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{name}_context")
    ctx = g.transpose(ctx, (0, 2, 1, 3), name=f"{name}_context_transpose")
    ctx = g.reshape(ctx, (n, s, HIDDEN), name=f"{name}_context_reshape")
    return g.linear(ctx, HIDDEN, HIDDEN, name=f"{name}_output_dense")


def _layer(g: GraphBuilder, x: str, n: int, s: int, name: str) -> str:
    attn = _attention(g, x, n, s, name=f"{name}_attention")
    x = g.layernorm(g.add(x, attn, name=f"{name}_attention_residual"), HIDDEN, name=f"{name}_attention_layernorm",
                    eps=LN_EPS)
    h = g.linear(x, HIDDEN, INTERMEDIATE, name=f"{name}_intermediate_dense", act="gelu")
    h = g.linear(h, INTERMEDIATE, HIDDEN, name=f"{name}_output_dense")
    return g.layernorm(g.add(x, h, name=f"{name}_output_residual"), HIDDEN, name=f"{name}_output_layernorm", eps=LN_EPS)


def build(shape: tuple[int, ...] = (1, 128)) -> onnx.ModelProto:
    n, s = shape
    if s > MAX_POSITIONS:
        raise ValueError(f"bert-tiny takes at most {MAX_POSITIONS} tokens, got {s}")
    g = GraphBuilder("bert-tiny", seed=SEED)
    ids = g.input("input_ids", shape, TensorProto.INT64)

    word_table = g.weight("embeddings_word.weight", (VOCAB, HIDDEN), 1.0)
    pos_table = g.weight("embeddings_position.weight", (MAX_POSITIONS, HIDDEN), 1.0)
    type_table = g.weight("embeddings_token_type.weight", (TYPE_VOCAB, HIDDEN), 1.0)
    words = g.op("Gather", [word_table, ids], "embeddings_word", axis=0)  # [n, s, H]
    positions = g.op("Gather", [pos_table, g.const("position_ids", np.arange(s))], "embeddings_position", axis=0)
    types = g.op("Gather", [type_table, g.const("token_type_ids", np.zeros(s, dtype=np.int64))],
                 "embeddings_token_type", axis=0)
    x = g.add(words, types, name="embeddings_add_token_type")
    x = g.add(x, positions, name="embeddings_add_position")
    x = g.layernorm(x, HIDDEN, name="embeddings_layernorm", eps=LN_EPS)

    for i in range(LAYERS):
        x = _layer(g, x, n, s, name=f"layer{i}")

    cls = g.op("Gather", [x, g.const("cls_index", 0)], "pooler_cls", axis=1)  # [n, H]
    pooled = g.linear(cls, HIDDEN, HIDDEN, name="pooler_dense")
    y = g.op("Tanh", [pooled], "pooler_tanh", outputs=["output"])
    return g.finish(y, (n, HIDDEN), doc=__doc__)
