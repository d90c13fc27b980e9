"""Where artifacts run: `agoc devices`, `agoc targets`, `agoc deploy` and `agoc bench` (one artifact timed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from host import render
from host.console import console, err_console
from host.options import ArtifactArg, BenchDeviceOpt, PhoneOpt
from toolchain import roofline
from toolchain.errors import AgocError, InputShapeError

DEVICE_COLUMNS = ("name", "kind", "usable", "abi", "cores", "model", "note")


def devices(as_json: Annotated[bool, typer.Option("--json", help="Print one JSON list.")] = False):
    """List the devices agoc can run on: local, qemu (if installed) and attached phones."""
    from host import devices as dv

    rows = [{"name": "local", "kind": "local", "usable": True, **dv.LocalDevice().describe()}]
    try:
        qemu = dv.qemu_device()
        dv.runner_build(qemu.runner_target)
        rows.append({"name": "qemu", "kind": "qemu", "usable": True, **qemu.describe()})
    except AgocError as exc:
        rows.append({"name": "qemu", "kind": "qemu", "usable": False, "note": str(exc)})
    for serial in dv.adb_serials():
        try:
            info = dv.adb_device(serial).describe()
            usable = str(info.get("abi", "")).startswith("arm64")
            rows.append({"name": serial, "kind": "adb", "usable": usable, **info,
                         **({} if usable else {"note": "not an arm64 device"})})
        except AgocError as exc:
            rows.append({"name": serial, "kind": "adb", "usable": False, "note": str(exc)})
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="devices", title_justify="left")
    for col in DEVICE_COLUMNS:
        table.add_column(col)
    for r in rows:
        table.add_row(*(escape(str(r.get(c, "") if r.get(c) is not None else "")) for c in DEVICE_COLUMNS))
    console.print(table)


def doctor(
    device: Annotated[Optional[str], typer.Option(
        "--device", help="Also check this phone (its adb serial) and start the runner on it.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON list of findings.")] = False,
):
    """Check what runs need — this machine's tools and, with --device, a phone — and say what to fix."""
    from host import devices as dv
    from host import doctor as dr
    from host.devices import DeviceError

    findings = dr.host_findings(dv.REPO)
    if device is not None:
        with err_console.status(f"checking {device}"):
            findings += dr.phone_findings(device, dv.adb_client())
    if as_json:
        print(json.dumps([f.to_json() for f in findings]))
    else:
        table = Table(title="agoc doctor", title_justify="left")
        for col in ("check", "status", "found", "fix"):
            table.add_column(col)
        style = {"ok": "green", "warn": "yellow", "fail": "red"}
        for f in findings:
            table.add_row(escape(f.check), f"[{style[f.status]}]{f.status}[/{style[f.status]}]", escape(f.detail),
                          escape(f.fix))
        console.print(table)
    failed = [f.check for f in findings if f.status == "fail"]
    if failed:
        raise DeviceError(f"{len(failed)} check(s) failed ({', '.join(failed)}): the fix column says what to do")


def targets():
    """List the target presets."""
    from toolchain import geometry
    from toolchain.targets import PRESETS

    table = Table(title="target presets", title_justify="left")
    for col in ("name", "triple", "mcpu", "linker", "cache geometry", "description"):
        table.add_column(col)
    for p in PRESETS:
        table.add_row(p.name, p.mtriple or "(host)", p.mcpu or "(detected)", p.linker, p.geometry or "-", p.description)
    console.print(table)
    caches = Table(title="cache geometries (--geometry; an ARM target's by --mcpu: "
                   + ", ".join(f"{cpu} {name}" for cpu, name in geometry.CPU_GEOMETRIES.items()) + ")",
                   title_justify="left")
    for col in ("name", "L1D", "L2", "shared", "kept inside"):
        caches.add_column(col)
    for g in geometry.GEOMETRIES:
        caches.add_row(g.name, g.l1d.label, g.l2.label, " / ".join(c.label for c in g.llc),
                       f"{geometry.locality_kib(g)} KiB")
    console.print(caches)
    for g in geometry.GEOMETRIES:
        console.print(f"[bold]{g.name}[/bold]: {escape(g.description)}. [dim]Source: {escape(g.source)}[/dim]")


def deploy(artifact_dir: ArtifactArg, device: PhoneOpt = None):
    """Push the runner, the TVM runtime and the artifact to a device; print where it landed."""
    from host.devices import get_device
    from toolchain.artifact import load_artifact

    art = load_artifact(artifact_dir)
    dev = get_device(device, default=None)
    with err_console.status(f"deploying to {dev.name}"):
        remote = dev.deploy(art)
    console.print(f"[green]✓[/green] {escape(str(artifact_dir))} → {escape(dev.name)}:{escape(remote)}")


def bench(
    artifact_dir: ArtifactArg,
    device: BenchDeviceOpt = None,
    threads: Annotated[Optional[int], typer.Option(help="Runtime threads (default: the runtime's).")] = None,
    cores: Annotated[Optional[str], typer.Option(help="Pin to these cores, e.g. 4,5,6,7 (the big cluster).")] = None,
    warmup: Annotated[Optional[int], typer.Option(help="Untimed runs first (default 5; with --proxy 2).")] = None,
    repeat: Annotated[Optional[int], typer.Option(help="Timed runs (default 20; with --proxy 1).")] = None,
    min_time_ms: Annotated[float, typer.Option(help="Keep timing until this much time has passed.")] = 0.0,
    per_kernel: Annotated[bool, typer.Option("--per-kernel", help="Also time each fused kernel.")] = False,
    proxy: Annotated[Optional[str], typer.Option(
        "--proxy", help="Instead of timing: simulate this phone cache geometry under valgrind (a76, a78, x1, a55, "
        "small-slc) and report instructions, D1 misses, L2 traffic and DRAM bytes per inference.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (with median_ms).")] = False,
    against: Annotated[Optional[list[str]], typer.Option(
        "--against", metavar="ENGINE|DIR", help="Time the artifact beside onnxruntime, or another build of the model "
        "(its artifact directory), on this machine instead (host artifacts; repeatable): same inputs and threads, "
        "separate processes, the same rounds, warm and cold caches; prints each one's ratio.")] = None,
):
    """Time the artifact on a device with the C++ runner (median, spread, cpufreq, temperature)."""
    from host.devices import BenchOptions, get_device
    from toolchain.artifact import load_artifact

    if threads is not None and threads < 1:
        raise InputShapeError(f"--threads must be at least 1 (got {threads}); leave it out for the runtime's default")
    if (warmup is not None and warmup < 0) or (repeat is not None and repeat < 1) or not min_time_ms >= 0:
        raise InputShapeError(f"--warmup must be 0 or more, --repeat at least 1 and --min-time-ms 0 or more (got "
                              f"{warmup}, {repeat}, {min_time_ms}); e.g. --warmup 5 --repeat 20")
    if against:
        _bench_against(artifact_dir, against, device, threads, warmup, repeat, as_json)
        return
    if proxy is not None:
        _bench_proxy(artifact_dir, device, proxy, 2 if warmup is None else warmup, 1 if repeat is None else repeat,
                     as_json)
        return
    warmup = 5 if warmup is None else warmup
    repeat = 20 if repeat is None else repeat
    core_list = _cores(cores)
    art = load_artifact(artifact_dir)
    dev = get_device(device or ("local" if art.target_preset == "host" else None), default=None)  # runs here
    options = BenchOptions(warmup, repeat, min_time_ms, threads, core_list, per_kernel)
    err_console.print(
        f"[dim]bench {escape(art.manifest.model_name)} on {escape(dev.name)} ({dev.kind}): warm-up {warmup}, "
        f"repeat {repeat}, threads {threads or 'default'}, cores {cores or 'any'}[/dim]",
        soft_wrap=True,
    )
    with err_console.status(f"running on {dev.name}"):
        result = dev.bench(art, options)
    result = {**result, "device": dev.name, "device_kind": dev.kind, "model": art.manifest.model_name,
              "target": art.target_preset, "warmup": warmup, "repeat": repeat}
    if "kernels" in result:
        result["kernels"] = roofline.kernel_rates(result["kernels"], list(art.manifest.kernels),
                                                  (result.get("peak") or {}).get("gflops"))
    if as_json:
        print(json.dumps(result))
        return
    console.print(render.bench_result_table(result))
    if result.get("kernels"):
        console.print(render.per_kernel_table(result))
    if dev.kind == "qemu":
        err_console.print("[yellow]note: times under qemu are emulated (≈25× slow): correctness only[/yellow]")


def _bench_against(artifact_dir: Path, engines: list[str], device: Optional[str], threads: Optional[int],
                   warmup: Optional[int], repeat: Optional[int], as_json: bool) -> None:
    """`agoc bench OUT --against onnxruntime --against OTHER`: host/bench/against.py."""
    from host.bench import against

    if device not in (None, "local"):
        raise AgocError("--against times every build on this machine: leave out --device")
    art = _host_artifact(artifact_dir)
    others = [Path(e) for e in dict.fromkeys(engines) if e != "onnxruntime"]
    for other in others:
        if not other.is_dir():
            raise AgocError(f"--against {other}: no artifact directory there; give `onnxruntime` or a directory "
                            "`agoc compile -o` wrote (e.g. --against onnxruntime)")
        _same_inputs(art, _host_artifact(other), other)
    builds = against.labels(artifact_dir, others)
    rounds = max(3, (repeat or 50) // 10)
    with err_console.status("timing the builds in turn (warm, then cold caches)") as status:
        result = against.compare(artifact_dir, threads, rounds=rounds, warmup=3 if warmup is None else warmup,
                                 on_round=lambda regime, r, n: status.update(f"{regime} caches: round {r}/{n}"),
                                 others=builds, reference="onnxruntime" in engines)
    if as_json:
        print(json.dumps({"model": art.manifest.model_name, **result.to_json()}))
        return
    console.print(render.against_table(art.manifest.model_name, result, artifact_dir.name))


def _host_artifact(path: Path):
    """The artifact at ``path``, which --against times on this machine: a host build."""
    from toolchain.artifact import load_artifact

    art = load_artifact(path)
    if art.target_preset != "host":
        raise AgocError(f"{path} was compiled for {art.target_preset}: --against times builds on this machine; "
                        "compile it with --target host")
    return art


def _same_inputs(art, other, path: Path) -> None:
    """Two builds are compared on the same inputs: the same names, shapes and types."""
    ours = [(t.info.name, tuple(t.info.shape), t.info.dtype) for t in art.manifest.inputs]
    theirs = [(t.info.name, tuple(t.info.shape), t.info.dtype) for t in other.manifest.inputs]
    if ours != theirs:
        raise AgocError(f"--against {path}: its inputs {theirs} are not this artifact's {ours}; compare builds of "
                        "the same model at the same input shape")


def _cores(cores: Optional[str]) -> Optional[tuple[int, ...]]:
    """``--cores 4,5,6,7`` as core numbers."""
    try:
        core_list = tuple(int(c) for c in cores.split(",")) if cores else None
        if core_list and min(core_list) < 0:
            raise ValueError(cores)
    except ValueError:
        raise InputShapeError(f"--cores '{cores}': expected comma-separated core numbers like 4,5,6,7") from None
    return core_list


def _bench_proxy(artifact_dir: Path, device: Optional[str], geometry: str, warmup: int, calls: int,
                 as_json: bool) -> None:
    """`agoc bench OUT --proxy GEOMETRY`: the phone-cache proxy (host/bench/proxy.py) on this machine."""
    from host.bench import proxy
    from toolchain.artifact import load_artifact

    if device not in (None, "local"):
        raise proxy.ProxyError(f"--proxy simulates a phone cache on this machine; drop --device {device}")
    if calls < 1:
        raise proxy.ProxyError("--repeat must be at least 1")
    geo = proxy.geometry(geometry)
    art = load_artifact(artifact_dir)
    sizes = ", ".join(c.label for c in (geo.l2, *geo.llc))
    err_console.print(
        f"[dim]phone-cache proxy {geo.name}: {escape(art.manifest.model_name)} under valgrind callgrind, "
        f"D1 {geo.l1d.label} {geo.l1d.assoc}-way, LL {sizes}; warm-up {warmup}, {calls} collected call(s), "
        f"1 thread, env -i[/dim]",
        soft_wrap=True,
    )
    with err_console.status(f"simulating {geo.name} caches"):
        result = proxy.measure(art, geo, warmup=warmup, calls=calls)
    if as_json:
        print(json.dumps(result))
        return
    console.print(render.proxy_result_table(result))
