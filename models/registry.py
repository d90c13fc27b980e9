"""The zoo as a table: one :class:`ModelSpec` row per network. A builder (``"module:function"``, imported
only when built, so listing stays cheap) takes the input shape and returns an ``onnx.ModelProto`` with
deterministic weights, ``ir_version`` <= 9 and opset 17."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import onnx

from toolchain.frontend import parse_shape

#: ONNX IR version every builder writes. onnx >= 1.23 defaults to IR 14, which
#: onnxruntime 1.31 refuses ("max supported IR version: 13").
IR_VERSION = 9
OPSET = 17


class UnknownModelError(KeyError):
    """A zoo name or shape that the table does not have."""

    def __str__(self) -> str:  # KeyError quotes its message; we do not want that
        return str(self.args[0])


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    builder: str  # "module:function"
    shapes: tuple[tuple[int, ...], ...]  # the shapes the benchmarks use; shapes[0] is the default
    input_dtype: str = "float32"
    published_params: int | None = None  # parameter count from the paper / reference implementation
    params_tolerance: float = 0.0  # allowed relative deviation from published_params
    family: str = "cnn"  # cnn | transformer | tiny
    source: str = ""  # where the architecture and published_params come from

    @property
    def default_shape(self) -> tuple[int, ...]:
        return self.shapes[0]


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="tiny-cnn",
        description="conv → relu → add (residual) → flatten → gemm; the demo model",
        builder="models.tiny:tiny_cnn",
        shapes=((1, 3, 16, 16), (1, 3, 32, 32)),
        family="tiny",
    ),
    ModelSpec(
        name="tiny-transformer",
        description="one attention-like block: matmul → softmax → matmul → add → layernorm",
        builder="models.tiny:tiny_transformer",
        shapes=((1, 16, 32),),
        family="tiny",
    ),
    ModelSpec(
        name="tiny-dwsep",
        description="MobileNet-style pointwise → depthwise → pointwise chain with relu6 (Clip)",
        builder="models.tiny:tiny_dwsep",
        shapes=((1, 8, 16, 16),),
        family="tiny",
    ),
    ModelSpec(
        name="mobilenet-v2",
        description="MobileNet-V2 1.0: stem + 17 inverted-residual blocks (ReLU6) + 1x1 conv 1280 + 1000-way FC",
        builder="models.mobilenet_v2:build",
        shapes=((1, 3, 224, 224), (1, 3, 112, 112), (1, 3, 56, 56)),
        published_params=3_504_872,
        params_tolerance=0.01,
        family="cnn",
        source=(
            "Sandler et al. 2018 (arXiv:1801.04381) Table 2; torchvision mobilenet_v2 (3,504,872 params incl. "
            "BN gamma/beta). BN is folded into conv bias here: 3,487,816 = 3,504,872 - 17,056 BN channels (-0.49%)."
        ),
    ),
    ModelSpec(
        name="mnasnet",
        description="MnasNet-B1 1.0 (no SE): stem + sepconv + 16 MBConv blocks (k3/k5, ReLU) + 1x1 conv 1280 "
                    "+ 1000-way FC",
        builder="models.mnasnet:build",
        shapes=((1, 3, 224, 224), (1, 3, 112, 112), (1, 3, 56, 56)),
        published_params=4_383_312,
        params_tolerance=0.01,
        family="cnn",
        source=(
            "Tan et al. 2019 (arXiv:1807.11626) MnasNet-B1; torchvision mnasnet1_0 (4,383,312 params incl. "
            "BN gamma/beta). BN is folded into conv bias here: 4,364,352 = 4,383,312 - 18,960 BN channels (-0.43%)."
        ),
    ),
    ModelSpec(
        name="mobilenet-v3-small",
        description="MobileNet-V3-Small 1.0: hard-swish stem + 11 inverted-residual blocks (9 with squeeze-excite) "
                    "+ 1x1 conv 576 + FC 1024 + 1000-way FC",
        builder="models.mobilenet_v3:build",
        shapes=((1, 3, 224, 224), (1, 3, 112, 112), (1, 3, 56, 56)),
        published_params=2_542_856,
        params_tolerance=0.01,
        family="cnn",
        source=(
            "Howard et al. 2019 (arXiv:1905.02244) Table 2; torchvision mobilenet_v3_small (2,542,856 params incl. "
            "BN gamma/beta). BN is folded into conv bias here: 2,536,800 = 2,542,856 - 6,056 BN channels (-0.24%); "
            "the squeeze-excite convs keep their own bias."
        ),
    ),
    ModelSpec(
        name="squeezenet-1.1",
        description="SqueezeNet 1.1: 3x3/2 conv + 8 Fire modules + 3 ceil-mode max pools + 1x1 conv classifier "
                    "+ global avg pool",
        builder="models.squeezenet:build",
        shapes=((1, 3, 224, 224), (1, 3, 112, 112), (1, 3, 56, 56)),
        published_params=1_235_496,
        params_tolerance=0.0,
        family="cnn",
        source=(
            "Iandola et al. 2016 (arXiv:1602.07360), v1.1 from forresti/SqueezeNet; torchvision squeezenet1_1 "
            "(1,235,496 params). No BatchNorm, so the count matches exactly."
        ),
    ),
    ModelSpec(
        name="resnet-18",
        description="ResNet-18: 7x7/2 stem + max pool + 4 stages of 2 BasicBlocks (64/128/256/512 ch, 3x3 convs) "
                    "+ 1000-way FC",
        builder="models.resnet:build",
        shapes=((1, 3, 224, 224), (1, 3, 112, 112), (1, 3, 56, 56)),
        published_params=11_689_512,
        params_tolerance=0.01,
        family="cnn",
        source=(
            "He et al. 2016 (arXiv:1512.03385) Table 1; torchvision resnet18 (11,689,512 params incl. BN "
            "gamma/beta). BN is folded into conv bias here: 11,684,712 = 11,689,512 - 4,800 BN channels (-0.04%)."
        ),
    ),
    ModelSpec(
        name="shufflenet-v2",
        description="ShuffleNet-V2 1.0x: stem + 4/8/4 units (116/232/464 ch, split + channel shuffle) "
                    "+ 1x1 conv 1024 + 1000-way FC",
        builder="models.shufflenet_v2:build",
        shapes=((1, 3, 224, 224), (1, 3, 112, 112), (1, 3, 56, 56)),
        published_params=2_278_604,
        params_tolerance=0.01,
        family="cnn",
        source=(
            "Ma et al. 2018 (arXiv:1807.11164) Table 5; torchvision shufflenet_v2_x1_0 (2,278,604 params incl. "
            "BN gamma/beta). BN is folded into conv bias here: 2,270,514 = 2,278,604 - 8,090 BN channels (-0.36%)."
        ),
    ),
    ModelSpec(
        name="bert-tiny",
        description="BERT-tiny encoder (2 layers, hidden 128, 2 heads, FFN 512, erf-GELU) on 128 tokens; "
                    "output = pooler output [1,128]",
        builder="models.bert_tiny:build",
        shapes=((1, 128),),
        input_dtype="int64",
        published_params=4_385_920,
        params_tolerance=0.0,
        family="transformer",
        source=(
            "Devlin et al. 2019 / Turc et al. 2019 (arXiv:1908.08962), google/bert_uncased_L-2_H-128_A-2 as "
            "Hugging Face BertModel: 4,385,920 params including the pooler (3,972,864 embeddings + 2 x 198,272 "
            "layers + 16,512 pooler); matches exactly. Single input input_ids (mask all ones, token types 0)."
        ),
    ),
    ModelSpec(
        name="mobilevit",
        description="MobileViT-XS: MV2 blocks + 3 MobileViT blocks (2/4/3 transformer layers, width 96/120/144, "
                    "2x2 patches) + 1000-way FC",
        builder="models.mobilevit:build",
        shapes=((1, 3, 224, 224),),
        published_params=2_300_000,
        params_tolerance=0.01,
        family="transformer",
        source=(
            "Mehta & Rastegari 2022 (arXiv:2110.02178) MobileViT-XS, 2.3M params (paper, rounded); "
            "apple/ml-cvnets mobilevit x_small / HF apple/mobilevit-x-small. This build has 2,313,624 with BN "
            "folded (+0.59%); the cvnets layout with BN gamma/beta is 2,317,848 (+0.78%), within rounding of 2.3M."
        ),
    ),
)


#: AGO's four micro-benchmark pairs (models/pairs.py): input 24 channels (pw first) or 144 (dw first).
PAIRS: tuple[ModelSpec, ...] = tuple(
    ModelSpec(
        name=f"pair-{kind}",
        description=f"AGO micro-benchmark: {kind.replace('-', ' → ')} convs with bias+ReLU6 (MobileNet-V2 block 3)",
        builder=f"models.pairs:{kind.replace('-', '_')}",
        shapes=((1, 24 if kind.startswith("pw") else 144, 56, 56), (1, 24 if kind.startswith("pw") else 144, 28, 28)),
        family="pair",
        source="AGO §VI-B micro benchmarks; shapes of MobileNet-V2 block 3 (Sandler et al. 2018, Table 2)",
    )
    for kind in ("pw-dw", "dw-pw", "dw-dw", "pw-pw")
)
MODELS = MODELS + PAIRS

_BY_NAME = {spec.name: spec for spec in MODELS}


def names() -> list[str]:
    return [spec.name for spec in MODELS]


def get(name: str) -> ModelSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown zoo model '{name}'; available: {', '.join(names())} (see `agoc models list`)"
        ) from None


def _resolve(ref: str):
    module_name, func_name = ref.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def build(name: str, shape: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """Build zoo model ``name`` at ``shape`` (default: the spec's first shape)."""
    spec = get(name)
    shape = tuple(shape) if shape else spec.default_shape
    model = _resolve(spec.builder)(shape)
    model.graph.name = model.graph.name or spec.name
    return model


def parse_zoo_ref(ref: str) -> tuple[str, tuple[int, ...] | None]:
    """``"zoo:mobilenet-v2@1x3x112x112"`` → ``("mobilenet-v2", (1, 3, 112, 112))``."""
    body = ref.removeprefix("zoo:")
    name, _, shape = body.partition("@")
    spec = get(name)  # raises UnknownModelError with the list of names
    if not shape:
        return name, None
    dims = parse_shape(shape)
    if len(dims) != len(spec.default_shape):
        example = "x".join(map(str, spec.default_shape))
        raise ValueError(f"bad shape '{shape}' for zoo:{name}: its input has {len(spec.default_shape)} dimensions, "
                         f"e.g. zoo:{name}@{example}")
    return name, dims
