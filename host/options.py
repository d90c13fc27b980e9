"""Options and arguments that several commands share, declared once as typer ``Annotated`` aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ModelArg = Annotated[str, typer.Argument(help="An ONNX file or zoo:NAME[@SHAPE].")]
ArtifactArg = Annotated[Path, typer.Argument(help="Artifact directory from `agoc compile`.")]

InputShapeOpt = Annotated[Optional[list[str]], typer.Option("--input-shape", "-s", help="NAME=1x3x224x224.")]
ThresholdOpt = Annotated[Optional[float], typer.Option(
    "--threshold", help="AGO's subgraph weight threshold Td (default: shipped with the weight fit).")]
KeepInsideOpt = Annotated[Optional[int], typer.Option(
    "--keep-inside", metavar="KIB", help="AGO, for a phone's cache: a conv feeding a depthwise / pointwise conv or "
    "matmul through a tensor of at least KIB KiB stays in one subgraph with it, and (tune) every intensive tile's "
    "slice of its intermediate is at most KIB KiB, so that it stays in cache. Default: half the L2 of the cache "
    "geometry (--geometry; an ARM target's own, e.g. 256 for a Cortex-A76; a host target's: this machine's). 0: off.",
    show_default=False)]
GeometryOpt = Annotated[Optional[str], typer.Option(
    "--geometry", metavar="NAME", help="The phone's cache geometry AGO's locality defaults follow (a76, a78, x1, a55, "
    "small-slc; see `agoc targets`), or none. Default: an ARM target's (by --mcpu); on host this machine's caches "
    "(Linux sysfs).")]
LayoutOpt = Annotated[str, typer.Option(
    "--layout", help="Activation layout of the kernels: NHWC (channels innermost and vectorised, the default) or "
    "NCHW (ONNX's own).")]
FastMathOpt = Annotated[bool, typer.Option(
    "--fast-math/--exact-math", help="exp, erf, tanh, sigmoid and softmax as vectorised polynomials (≤ 3e-7 from "
    "the exact functions; 4-80x faster than one libm call per element, toolchain/fastmath.py).")]
WinogradOpt = Annotated[bool, typer.Option(
    "--winograd/--direct-conv", help="3×3 stride-1 convs as Winograd's F(4×4 or 2×2, 3×3): the weights transformed at "
    "compile time, 2.25-4x fewer multiplications (float32, NHWC; outputs within 1e-5 relative of the direct conv's, "
    "toolchain/winograd.py).")]
PrecisionOpt = Annotated[str, typer.Option(
    "--precision", help="fp32 (the default) or fp16: convs, matmuls and the ops between them in float16 (ARM targets: "
    "ARMv8.2-A FP16 arithmetic, twice the lanes per NEON register, half the weight bytes); inputs and outputs stay "
    "float32, and outputs are checked within 2 % of their largest value instead of 0.01 %.")]
PadChannelsOpt = Annotated[bool, typer.Option(
    "--pad-channels/--no-pad-channels", help="Convs and matmuls with 512 or more output channels that 16 does not "
    "divide (e.g. a 1000-class classifier conv) and 16 or more rows compute up to 5 % more zero channels, sliced "
    "off, so that their kernels vectorise in whole registers; so do convs of up to four vectors of channels that the "
    "target's vector does not divide, where whole vectors take a fifth fewer FMAs (24 → 32 on AVX-512; NHWC) "
    "(toolchain/padding.py).")]
PhoneOpt = Annotated[Optional[str], typer.Option(
    "--device", help="qemu, local, or a phone's serial (default: ANDROID_SERIAL or the only phone).")]
BenchDeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="qemu, local, or a phone's serial (default: local for a host build; else ANDROID_SERIAL or the "
    "only phone).")]
TrackerOpt = Annotated[Optional[str], typer.Option(
    "--tracker", help="HOST:PORT (default: the one `agoc tracker start` started).")]
ProxyOpt = Annotated[Optional[str], typer.Option("--proxy", help="Simulate this phone cache geometry under valgrind "
                                                 "(a76, a78, x1, a55, small-slc).")]
ResultsDirOpt = Annotated[Path, typer.Option("--out", help="Where the JSON (and PNG) go.")]
ArchOpt = Annotated[str, typer.Option("--arch", help="CUDA compute capability (--target cuda only).")]

# the search knobs `tune` and `bench-suite` share
SchedulerOpt = Annotated[str, typer.Option(
    "--scheduler", help="How the budget is spread over the kernels: weight (planned by AGO weight), latency (a "
    "first batch each, then rounds where they save most) or roofline (three quarters by weight, the last quarter "
    "in rounds to the kernels furthest above their roofline floor).")]
NoPrepackOpt = Annotated[bool, typer.Option(
    "--no-prepack", help="Keep every weight in the model's layout (by default a schedule may store each weight in "
    "the order it reads it, rewritten once at build time).")]
TransferOpt = Annotated[int, typer.Option(
    "--transfer", help="Start each kernel's search from the verified schedules of up to this many kernels with the "
    "same blocks, or the same conv with another epilogue, re-fitted to its loops (0: from scratch).")]
PopulationOpt = Annotated[int, typer.Option(
    "--population", help="Candidates the search's cost model scores and evolves before each batch (MetaSchedule's "
    "evolutionary search; smaller: faster batches).")]
