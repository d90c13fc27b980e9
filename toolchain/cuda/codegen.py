"""GPU schedules, CUDA code generation with TVM, PTX/cubin with nvcc, kernel counts.

Two pipelines over the same legalized training module:

* **stock** — TVM's own CUDA pipeline (``relax.backend.cuda``): ``FuseOps`` +
  ``FuseTIR``, then dlight's default GPU rules (Matmul, GEMV, Reduction,
  GeneralReduction, Fallback). On training graphs dlight's GEMV and
  Reduction rules raise on some fused functions (an ``AssertionError`` in
  ``gemv.normalize``, an ``InternalError`` on a keepdims mean), which aborts
  ``tvm.compile``; agoc applies the same rules in the same order but treats
  a rule that raises as not applicable (recorded in ``notes``).
* **fused** — APOLLO's partition (:mod:`toolchain.cuda.stitch`) built with
  :func:`toolchain.fusion.outline_groups` + ``FuseTIR``; each group with a
  row form gets the stitched schedule below, every other group the same
  guarded dlight rules. A group no schedule accepts is split back into single
  ops and the module rebuilt (APOLLO's feedback from the fusion phase).

The stitched schedule (FusionStitching's block composition): every block
of the fused PrimFunc has the same row loops; they are fused per block and
merged across blocks into one loop bound to ``blockIdx.x`` (one row per
thread block). Each block's column loop (the reduced dims, or the columns
of a full-row op) is split by the thread count and bound to ``threadIdx.x``
— for reductions TVM lowers that to a cross-thread all-reduce (warp
shuffles, then shared memory). Intermediates stay on chip: reduction
results and full-row intermediates in ``__shared__``, row scalars computed
by every thread in registers; a reduction result that also leaves the
kernel is written through a shared cache. All threads map columns the same
way (``col = k * threads + threadIdx.x``), so a full row is only ever read
by the thread that wrote it, and cross-thread data flows only through the
shared reduction results, where TVM inserts the barriers.

Kernel counts come from the generated CUDA source: the ``__global__``
functions of each PrimFunc times the number of times ``main`` calls it —
launches per training step.
"""

from __future__ import annotations

import collections
import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from toolchain.build import error_line, lower_and_compile
from toolchain.errors import BuildError, TargetError

DEFAULT_ARCH = "sm_90"


@dataclass(frozen=True)
class CudaTarget:
    """Enough of :class:`toolchain.targets.TargetSpec` for the fusion helpers (``tvm()``, ``to_json``)."""

    arch: str = DEFAULT_ARCH
    preset: str = "cuda"
    runs_on_host: bool = False

    @property
    def tvm_target(self) -> dict:
        return {"kind": "cuda", "arch": self.arch}

    def tvm(self):
        import tvm

        return tvm.target.Target(self.tvm_target)

    def to_json(self) -> dict:
        return {"preset": self.preset, "tvm_target": self.tvm_target}


def cuda_target(arch: str = DEFAULT_ARCH) -> CudaTarget:
    if not re.fullmatch(r"sm_\d{2,3}[a-z]?", arch):
        raise TargetError(f"--arch '{arch}' is not a CUDA compute capability like sm_80, sm_90 or sm_90a")
    return CudaTarget(arch)


def _dlight_rules():
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), FullReduction(),
            dl.gpu.Fallback()]


class FullReduction:
    """agoc's rule between dlight's GeneralReduction and Fallback, for PrimFuncs holding a reduction to a
    single element (a training step's loss) and otherwise spatial blocks. dlight's Reduction raises on
    such a block, GeneralReduction puts its kernel in a host loop (one launch per element) and Fallback
    gives it one thread. Here the full reduction is one block of threads, each summing a strided share,
    then a cross-thread reduction; every other block is one flat kernel. Both pipelines use it."""

    threads = 1024

    def apply(self, func, target, _tunable=False):
        from tvm import s_tir

        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        full = []
        for b in blocks:
            block = sch.get(b)
            if all(int(iv.iter_type) == 0 for iv in block.iter_vars):
                continue
            if len(block.writes) != 1 or math.prod(int(d) for d in _buffer(block.writes[0]).shape) != 1:
                return None  # a reduction with more than one output element: not this rule's
            full.append(b)
        if not full:
            return None
        def is_full(b, among) -> bool:
            return any(b.same_as(f) for f in among)

        for b in blocks:  # spatial blocks inlined into spatial consumers, as dlight's Fallback does; not into a
            # full reduction, which would then run its whole producer chain on one block of threads
            if is_full(b, full) or any(is_full(c, full) for c in sch.get_consumers(b)):
                continue
            try:
                sch.compute_inline(b)
            except Exception:  # noqa: BLE001 - an output, or read at other elements: keeps its kernel
                pass
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        full = [b for b in blocks if any(int(iv.iter_type) != 0 for iv in sch.get(b).iter_vars)]
        for b in blocks:  # first, every block under a loop: rfactor fails on a root with a loop-less block
            if not sch.get_loops(b):
                sch.add_unit_loop(b)
        for b in blocks:
            loops = sch.get_loops(b)
            if is_full(b, full):
                if all(int(sch.get(lp).extent) == 1 for lp in loops):
                    return None
                # its loops are all reduction loops, or spatial of extent 1 (fused too: a cross-thread
                # reduction needs every loop of the block inside the thread binding)
                self._reduce(sch, b, sch.fuse(*loops) if len(loops) > 1 else loops[0])
            else:
                fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
                extent = int(sch.get(fused).extent)
                outer, inner = sch.split(fused, [None, min(self.threads, extent)])
                sch.bind(outer, "blockIdx.x")
                sch.bind(inner, "threadIdx.x")
        return sch

    #: above this many elements, partial sums on ``partials`` thread blocks first, then one block sums them
    one_block_most = 1 << 16
    partials = 256

    def _reduce(self, sch, block, loop) -> None:
        extent = int(sch.get(loop).extent)
        if extent > self.one_block_most:
            outer, loop = sch.split(loop, [self.partials, None])
            rf = sch.rfactor(outer, 0)
            part, inner = sch.get_loops(rf)[-2:]
            sch.bind(part, "blockIdx.x")
            self._threads(sch, inner, 256)
            (loop,) = sch.get_loops(block)[-1:]
        self._threads(sch, loop, min(self.threads, 1 << max(5, (int(sch.get(loop).extent) - 1).bit_length())))

    @staticmethod
    def _threads(sch, loop, threads: int) -> None:
        serial, inner = sch.split(loop, [None, threads])
        sch.reorder(inner, serial)  # a thread's share is strided by `threads`: loads coalesce
        sch.bind(inner, "threadIdx.x")


def schedule_dlight(func, target, notes: list | None = None, name: str = ""):
    """dlight's default GPU rules in order; a rule that raises counts as not applicable.
    → (func, rule) or (None, None)."""
    for rule in _dlight_rules():
        try:
            sch = rule.apply(func, target, False)
        except Exception as exc:  # noqa: BLE001 - a dlight bug on this function: try the next rule
            if notes is not None:
                notes.append(f"dlight {type(rule).__name__} raised on {name}: {type(exc).__name__} {error_line(exc)}")
            continue
        if sch is None:
            continue
        if isinstance(sch, list):
            sch = sch[0]
        scheduled = sch.mod["main"]
        launches = host_launches(scheduled.body)
        if launches > 1:  # dlight's GeneralReduction on a full reduction to a scalar: a kernel per element
            if notes is not None:
                notes.append(f"dlight {type(rule).__name__} on {name} rejected: its kernel sits in a host loop "
                             f"({launches} launches per call)")
            continue
        return scheduled.with_attr("tirx.is_scheduled", True), type(rule).__name__
    return None, None


def host_launches(stmt, outer: int = 1) -> int:
    """Kernel launches per call a scheduled PrimFunc's body makes at most: the product of the extents of
    the host (not thread-bound) loops around each kernel. 1 for a well-formed GPU schedule; a symbolic
    extent counts as 2."""
    if stmt is None:
        return 0
    if hasattr(stmt, "seq"):
        return max([host_launches(s, outer) for s in stmt.seq] or [0])
    if hasattr(stmt, "loop_var"):
        if stmt.thread_binding is not None:
            return outer
        extent = int(stmt.extent.value) if hasattr(stmt.extent, "value") else 2
        return host_launches(stmt.body, outer * extent)
    if hasattr(stmt, "block") and hasattr(stmt, "iter_values"):
        return host_launches(stmt.block.body, outer)
    if hasattr(stmt, "then_case"):
        return max(host_launches(stmt.then_case, outer), host_launches(stmt.else_case, outer))
    return host_launches(stmt.body, outer) if hasattr(stmt, "body") else 0


# --------------------------------------------------------------- stitched schedule


def _split_row_col(sch, block_rv, rows: tuple[int, ...], cols: int):
    """Index of the first column loop of ``block_rv`` (its row loops come first), and whether it has columns."""
    loops = sch.get_loops(block_rv)
    extents = [int(sch.get(lp).extent) for lp in loops]
    acc: list[int] = []
    p = 0
    while p < len(loops) and tuple(acc) != tuple(rows):
        if extents[p] > 1:
            acc.append(extents[p])
        p += 1
    if tuple(acc) != tuple(rows):
        raise BuildError(f"block {sch.get(block_rv).name_hint}: loops {extents} do not start with rows {list(rows)}")
    rest = math.prod(extents[p:])
    if rest not in (1, cols):
        raise BuildError(f"block {sch.get(block_rv).name_hint}: {rest} columns per row, expected {cols}")
    return p, rest > 1


def schedule_stitched(func, rows: tuple[int, ...], cols: int, threads: int):
    """One thread block per row, every block of ``func`` inside it (see the module docstring)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    blocks = list(sch.get_child_blocks(root))
    params = list(func.params)

    def is_param(buf) -> bool:
        return any(buf.same_as(p) or buf.data.same_as(p.data) for p in params)

    def is_reduction(block_rv) -> bool:
        return any(int(iv.iter_type) == 2 for iv in sch.get(block_rv).iter_vars)

    # reduction results that leave the kernel and are read inside it: write them through a shared cache
    for b in list(blocks):
        if not is_reduction(b):
            continue
        out = sch.get(b).writes[0]
        buf = out.source if hasattr(out, "source") else out.buffer
        consumers = list(sch.get_consumers(b))
        if is_param(buf) and consumers:
            sch.cache_write(b, 0, "shared", consumer_blocks=consumers)
    blocks = list(sch.get_child_blocks(root))

    # scopes of the intermediates: reduction results and full rows in shared memory, row scalars in registers
    for b in blocks:
        out = sch.get(b).writes[0]
        buf = out.source if hasattr(out, "source") else out.buffer
        if is_param(buf) or buf.scope() == "shared":
            continue
        _, has_cols = _split_row_col(sch, b, rows, cols)
        scope = "shared" if (is_reduction(b) or has_cols) else "local"
        sch.set_scope(b, 0, scope)

    row_loops, col_loops = [], []
    for b in blocks:
        p, has_cols = _split_row_col(sch, b, rows, cols)
        loops = sch.get_loops(b)
        if p == 0:
            if not loops:
                sch.add_unit_loop(b)
            else:
                sch.add_unit_loop(loops[0])
            loops = sch.get_loops(b)
            p = 1
        row = sch.fuse(*loops[:p]) if p > 1 else loops[0]
        col = None
        if len(loops) > p:
            col = sch.fuse(*loops[p:]) if len(loops) - p > 1 else loops[p]
        row_loops.append(row)
        col_loops.append(col if has_cols else None)
    merged = sch.merge(*row_loops) if len(row_loops) > 1 else row_loops[0]
    sch.bind(merged, "blockIdx.x")
    for b, col in zip(blocks, col_loops):
        if col is None:
            continue
        loops = sch.get_loops(b)
        _, inner = sch.split(loops[-1], [None, threads])
        sch.bind(inner, "threadIdx.x")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def schedule_packed(func, threads: int = 256):
    """Kernel packing / thread composition for groups without reductions whose blocks all cover the same
    element space and read each other's outputs element by element: one flat loop, intermediates in registers."""
    import tvm_ffi
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    params = list(func.params)
    written = {}
    sizes = set()
    for b in blocks:
        block = sch.get(b)
        if any(int(iv.iter_type) != 0 for iv in block.iter_vars):
            raise BuildError(f"{block.name_hint} is not a spatial block")
        out = block.writes[0]
        written[_buffer(out).name] = b
        sizes.add(math.prod(int(iv.dom.extent) for iv in block.iter_vars))
    if len(sizes) != 1:
        raise BuildError(f"blocks cover different element counts {sorted(sizes)}")
    for b in blocks:
        block = sch.get(b)
        mine = [r.min for r in block.writes[0].region]
        for read in block.reads:
            if _buffer(read).name in written and _buffer(read).name != _buffer(block.writes[0]).name:
                theirs = [r.min for r in read.region]
                if len(theirs) != len(mine) or not all(tvm_ffi.structural_equal(a, c) for a, c in zip(theirs, mine)):
                    raise BuildError(f"{block.name_hint} reads {_buffer(read).name} at other elements")
    for b in blocks:
        buf = _buffer(sch.get(b).writes[0])
        if not any(buf.same_as(p) or buf.data.same_as(p.data) for p in params):
            sch.set_scope(b, 0, "local")
    flat = []
    for b in blocks:
        loops = sch.get_loops(b)
        if not loops:
            sch.add_unit_loop(b)
            loops = sch.get_loops(b)
        flat.append(sch.fuse(*loops) if len(loops) > 1 else loops[0])
    merged = sch.merge(*flat) if len(flat) > 1 else flat[0]
    outer, inner = sch.split(merged, [None, threads])
    sch.bind(outer, "blockIdx.x")
    sch.bind(inner, "threadIdx.x")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _buffer(region):
    return region.source if hasattr(region, "source") else region.buffer


# --------------------------------------------------------------- pipelines


@dataclass
class Scheduled:
    """A fused, GPU-scheduled module and how each kernel was scheduled."""

    mod: object = field(repr=False)
    schedules: dict  # PrimFunc name -> "stitched" | dlight rule name
    notes: list
    plan: object = None  # stitch.Plan for the fused pipeline


def _call_order(mod) -> list[str]:
    """PrimFunc names of main's call_tir bindings, in binding order (one per fused group)."""
    from tvm import relax

    names = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.call_tir":
                names.append(v.args[0].name_hint)
    return names


def stock(legalized, target: CudaTarget) -> Scheduled:
    """TVM's CUDA pipeline: FuseOps + FuseTIR + dlight default rules (guarded)."""
    import tvm
    from tvm import relax, tirx

    t = target.tvm()
    with t:
        mod = tvm.transform.Sequential(
            [relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
        )(legalized)
    notes: list = []
    schedules = {}
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tirx.PrimFunc):
            continue
        with t:
            new, rule = schedule_dlight(func, t, notes, gv.name_hint)
        if new is None:
            raise BuildError(f"no dlight rule schedules {gv.name_hint} for CUDA")
        mod[gv] = new
        schedules[gv.name_hint] = rule
    return Scheduled(mod, schedules, notes)


#: group labels whose complex op needs dlight's tiled Matmul schedule to be fast
TILED_LABELS = ("matmul", "conv")


def _feedback(group, how: str, func) -> str:
    """Why a merged group's schedule is handed back (APOLLO §3.3's feedback from the downstream
    optimizer), or "": split into ops, or, for a serial reduction, its reductions peeled off
    (``stitch.peel_reductions``). Both were measured per kernel with ncu on an H200: BERT-tiny's
    weight-gradient matmuls merged with their bias gradients fell to GeneralReduction (2.5x slower
    than the matmul alone), and a MobileNet-V2 block's ReLU6 backward merged with a BatchNorm
    gradient's per-channel sum fell to Fallback (297 us against 6 us for the sum alone)."""
    if len(group.members) < 2:
        return ""
    if group.label in TILED_LABELS and how != "Matmul":
        return "not Matmul"
    if group.label == "reduction" and how == "Fallback":
        length = reduction_length(func)
        if length >= SERIAL_REDUCTION_MOST:
            return f"which sums {length} elements per output on one thread"
    return ""


#: Fallback's one thread per reduction output is left alone below this many elements per output. At
#: 128 (BERT-tiny's bias gradients, bias+GELU's) peeling the reductions off was faster on the H200 too
#: (bias+GELU 1.52x -> 2.34x stock) and the element-wise rest stays one kernel, so launches barely move.
SERIAL_REDUCTION_MOST = 128


def _graph_facts(legalized):
    """(consumers by op id, op types) of a legalized module, for peeling reductions off a group."""
    from toolchain.cuda import optype
    from toolchain.opgraph import op_graph

    graph = op_graph(legalized)
    return graph.consumers, optype.op_types(legalized, graph)


def reduction_length(func) -> int:
    """The most elements one output of a reduction block of ``func`` sums (1 without reductions)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    lengths = [math.prod(int(iv.dom.extent) for iv in sch.get(b).iter_vars if int(iv.iter_type) != 0)
               for b in sch.get_child_blocks(sch.get_sblock("root"))]
    return max(lengths, default=1)


def _schedule_group(func, group, t, notes: list, name: str) -> tuple:
    """(schedule, how) of one group's kernel: stitched for a row-form group, packed for a multi-op
    element-wise one, dlight otherwise or when those fail (the failure noted); (None, ...) when none does."""
    if group.form is not None:
        try:
            with t:
                return schedule_stitched(func, group.form.rows, group.form.cols, group.form.threads), "stitched"
        except Exception as exc:  # noqa: BLE001 - fall back to dlight, and say why
            notes.append(f"stitched schedule failed on {name}: {type(exc).__name__} {error_line(exc)}")
    if group.label in ("element-wise", "broadcast") and len(group.members) > 1:
        try:
            with t:
                return schedule_packed(func), "packed"
        except Exception as exc:  # noqa: BLE001 - not one element space: dlight decides
            notes.append(f"packed schedule not applicable to {name}: {error_line(exc)}")
    with t:
        return schedule_dlight(func, t, notes, name)


def fused(legalized, plan, target: CudaTarget, max_feedback: int = 20) -> Scheduled:
    """APOLLO's partition: outline + FuseTIR, stitched schedules for row-form groups, dlight for the rest."""
    from toolchain import fusion
    from toolchain.cuda import stitch

    t = target.tvm()
    notes: list = []
    facts = None  # the op graph's consumers and op types, when a group's reductions are to be peeled
    for _ in range(max_feedback + 1):
        mod = fusion.fuse_groups(legalized, plan.group_lists, target, concat_in_place=False)  # one block per output
        names = _call_order(mod)
        if len(names) != len(plan.groups):
            raise BuildError(f"expected one kernel per group ({len(plan.groups)}), found {len(names)} calls")
        schedules: dict = {}
        failed: list[tuple[int, str, bool]] = []  # groups handed back this round: (index, why, peel its reductions)
        for index, (name, group) in enumerate(zip(names, plan.groups)):
            if name in schedules:
                continue
            func = mod[name]
            new, how = _schedule_group(func, group, t, notes, name)
            if new is None:
                if len(group.members) == 1:
                    raise BuildError(f"cannot schedule a single op for CUDA: no schedule for {name}")
                failed.append((index, f"no schedule for {name}", False))
                continue
            why = _feedback(group, how, func)
            if why:
                failed.append((index, f"feedback: dlight schedules {name} with {how}, {why}",
                               why.startswith("which sums")))
                continue
            mod[name] = new
            schedules[name] = how
        if not failed:
            return Scheduled(mod, schedules, notes, plan)
        for index, reason, peel in sorted(failed, reverse=True):  # from the back: earlier indices stay valid
            if peel:
                facts = facts or _graph_facts(legalized)
                plan = stitch.peel_reductions(plan, index, reason, *facts)
            else:
                plan = stitch.split_group(plan, index, reason)
    raise BuildError("too many groups needed splitting after code generation")


# --------------------------------------------------------------- code generation


@dataclass(frozen=True)
class CudaBuild:
    source: str = field(repr=False)
    kernels_per_func: dict  # PrimFunc name -> number of __global__ kernels
    calls: dict  # PrimFunc name -> calls from main
    shared_kernels: tuple[str, ...]  # kernels that declare __shared__ memory
    executable: object = field(default=None, repr=False, compare=False)  # the Relax VM executable

    @property
    def launches(self) -> int:
        """Kernel launches in one call of main (one training step)."""
        return sum(self.kernels_per_func.get(f, 0) * n for f, n in self.calls.items())

    @property
    def kernel_count(self) -> int:
        return sum(self.kernels_per_func.values())

    def to_json(self) -> dict:
        return {"launches_per_step": self.launches, "kernels": self.kernel_count,
                "primfuncs": len(self.calls), "kernels_with_shared": len(self.shared_kernels)}


_KERNEL_DEF = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)\s*\{')


def _kernel_bodies(source: str) -> dict[str, str]:
    """Kernel name -> its body text (definitions only, not the forward declarations)."""
    out = {}
    matches = list(_KERNEL_DEF.finditer(source))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(source)
        out[m.group(1)] = source[m.end():end]
    return out


def kernel_owner(kernel: str, funcs) -> str | None:
    """The PrimFunc a kernel belongs to: TVM names them ``<func>_kernel`` and ``<func>_kernel_<i>``."""
    base = re.sub(r"_kernel(_\d+)?$", "", kernel)
    return base if base in funcs else None


def build_cuda(mod, target: CudaTarget) -> CudaBuild:
    """``tvm.compile`` for CUDA; the CUDA source and per-PrimFunc kernel counts (no nvcc needed)."""
    from tvm.relax.backend.cuda import pipeline as cuda

    # lowering only: the module is already fused and scheduled
    executable = lower_and_compile(mod, target.tvm(), cuda, " for CUDA")
    source = _find_cuda_source(executable.mod)
    calls = collections.Counter(_call_order(mod))
    bodies = _kernel_bodies(source)
    per_func: collections.Counter = collections.Counter()
    shared = []
    for kernel, body in bodies.items():
        owner = kernel_owner(kernel, calls)
        if owner is None:
            raise BuildError(f"kernel {kernel} belongs to no PrimFunc called from main")
        per_func[owner] += 1
        if "__shared__" in body:
            shared.append(kernel)
    return CudaBuild(source, dict(per_func), dict(calls), tuple(shared), executable)


def _find_cuda_source(module) -> str:
    if module.kind == "cuda":
        return module.inspect_source("")
    for sub in module.imports:
        found = _find_cuda_source(sub)
        if found:
            return found
    return ""


def find_nvcc() -> str | None:
    return shutil.which("nvcc")


def nvcc_compile(source_path: Path, arch: str, out: Path, fmt: str = "ptx", nvcc: str | None = None,
                 options: tuple[str, ...] = ()) -> Path:
    """Compile the CUDA source with nvcc to ``fmt`` (ptx or cubin) at ``out``, with extra ``options``."""
    nvcc = nvcc or find_nvcc()
    if not nvcc:
        raise TargetError("nvcc not found: install the CUDA toolkit (or skip PTX: the .cu source is still written)")
    arch_flag = f"-arch={arch}" if fmt == "cubin" else f"-arch=compute_{arch[3:]}"
    cmd = [nvcc, f"--{fmt}", "-O3", arch_flag, *options, "-o", str(out), str(source_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed ({' '.join(cmd)}): {error_line(RuntimeError(proc.stderr))}")
    return out


def ptx_entries(ptx: str) -> list[str]:
    return re.findall(r"\.visible \.entry (\w+)\(", ptx)
