"""A corpus of bad and hostile inputs to every `agoc` command (issue 56).

Each case sets up a scratch directory, runs one command in-process and asserts the contract:
exit code 1 (a user's mistake, never 2: that is agoc's own bug), one line on stderr starting with
'error:' that names the fix, no traceback, and no file touched — the scratch tree and the shared
files keep every name, size and mtime, nothing named like 'pwned' appears anywhere. Typer's own
usage errors (an unknown option, a value that is not a number) are marked ``usage``: exit 1, no
traceback, typer's usage panel. Nearly every case fails before any TVM build; one tiny artifact
(a valid model whose tensor and node names are shell metacharacters) is compiled once per module.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from models.registry import IR_VERSION, OPSET
from tests.fakeadb import FakeAdbServer

REPO = Path(__file__).resolve().parents[2]

#: a one-line message names its fix: what to do, or the values that are accepted
FIX = re.compile(r"\b(give|use|choose|recompile|check|re-export|export|create|run|drop|connect|add|move|upgrade|"
                 r"replace|make|remove|leave|set|unset|rerun|pass|say|copy|write|must|expected|available|see|needs|"
                 r"inputs are|"
                 r"declares|fixed shape)\b|e\.g\.", re.I)
#: a message string that lost its f prefix
UNFORMATTED = re.compile(r"\{[A-Za-z_][A-Za-z_0-9.]*(\(\))?(:[^}]*)?\}")
#: what a command echoes on stderr before long work (its resolved settings); the error line comes last
ECHO = ("compiling ", "tuning ", "running ", "bench ", "phone-cache proxy", "building for ")

HOSTILE_INPUT = "x $(touch pwned) `touch pwned` \"q\" 'q' ü"
HOSTILE_OUTPUT = "y;rm -rf .;|&<>*?\ttab\nnewline"
HOSTILE_NODE = "node $(touch pwned); rm -rf ~ #{0} %s \\ 🚀"
GARBAGE = bytes((i * 131 + 7) % 256 for i in range(4096))  # deterministic noise
SYSTEM_SO = next((p for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/aarch64-linux-gnu/libz.so.1",
                              "/lib/x86_64-linux-gnu/libc.so.6") if os.path.exists(p)), None)


# ----------------------------------------------------------------------------- shared files


@dataclass
class Shared:
    root: Path  # snapshotted around every case: nothing in it may change
    model: Path  # tiny-cnn, valid
    hostile: Path  # tiny-cnn with shell metacharacters in every name
    art: Path  # the hostile model compiled (a valid artifact)
    other: Path  # another model's artifact (a 1x4 Relu), whose library can be swapped in


def hostile_model() -> onnx.ModelProto:
    """tiny-cnn with hostile input, output and node names (an otherwise valid model)."""
    m = models.build("tiny-cnn")
    g = m.graph
    rename = {g.input[0].name: HOSTILE_INPUT, g.output[0].name: HOSTILE_OUTPUT}
    for i, node in enumerate(g.node):
        node.name = HOSTILE_NODE.format(i)
        node.input[:] = [rename.get(x, x) for x in node.input]
        node.output[:] = [rename.get(x, x) for x in node.output]
    for value in [*g.input, *g.output]:
        value.name = rename.get(value.name, value.name)
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    from typer.testing import CliRunner

    from host import cli as cli_module

    root = tmp_path_factory.mktemp("shared")
    model, hostile = root / "tiny-cnn.onnx", root / "hostile $(touch pwned).onnx"
    onnx.save(models.build("tiny-cnn"), str(model))
    onnx.save(hostile_model(), str(hostile))
    result = CliRunner().invoke(cli_module.app, ["compile", str(hostile), "-o", str(root / "art")])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    onnx.save(relu_model(), str(root / "relu.onnx"))
    result = CliRunner().invoke(cli_module.app, ["compile", str(root / "relu.onnx"), "-o", str(root / "other")])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return Shared(root, model, hostile, root / "art", root / "other")


@pytest.fixture(scope="module")
def no_phone(tmp_path_factory):
    """An adb server with no phone attached (so `deploy` and `bench` find none, without starting adb)."""
    with FakeAdbServer(tmp_path_factory.mktemp("phone")) as server:
        server.unplug()
        yield server


@pytest.fixture
def mounts():
    """mount(path, options): a tmpfs there for this case (unmounted after); skips where mounting fails."""
    done: list[Path] = []

    def mount(path: Path, options: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()}): needs root")
        done.append(path)

    yield mount
    for path in reversed(done):
        subprocess.run(["umount", "-l", str(path)], check=False)


# ----------------------------------------------------------------------------- set-ups


@dataclass
class Env:
    t: Path  # the case's scratch directory (also the working directory)
    s: Shared
    mount: Callable[[Path, str], None]


def write(name: str, data: bytes | str = GARBAGE):
    def setup(e: Env):
        path = e.t / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return setup


def truncated(name: str, keep: Callable[[int], int]):
    def setup(e: Env):
        data = e.s.model.read_bytes()
        (e.t / name).write_bytes(data[:keep(len(data))])
    return setup


def onnx_file(name: str, build: Callable[[], onnx.ModelProto]):
    def setup(e: Env):
        onnx.save(build(), str(e.t / name))
    return setup


def mkdir(*names: str):
    def setup(e: Env):
        for name in names:
            (e.t / name).mkdir(parents=True, exist_ok=True)
    return setup


def user_dir(name: str, manifest: Optional[str] = None):
    """A folder of the user's (a web app), optionally with a manifest.json of its own."""
    def setup(e: Env):
        root = e.t / name
        (root / "src").mkdir(parents=True)
        (root / "index.html").write_text("<html>mine</html>")
        (root / "src" / "app.js").write_text("console.log('mine')")
        if manifest is not None:
            (root / "manifest.json").write_text(manifest)
    return setup


def symlink(name: str, to: str):
    def setup(e: Env):
        (e.t / name).symlink_to(to)
    return setup


def artifact(edit: Optional[Callable[[Path], None]] = None, name: str = "art"):
    """A copy of the shared artifact at t/NAME, then ``edit(root)``."""
    def setup(e: Env):
        root = e.t / name
        shutil.copytree(e.s.art, root)
        if edit:
            edit(root)
    return setup


def manifest_text(text: str):
    return artifact(lambda root: (root / "manifest.json").write_text(text))


def manifest_edit(change: Callable[[dict], None]):
    def edit(root: Path):
        data = json.loads((root / "manifest.json").read_text())
        change(data)
        (root / "manifest.json").write_text(json.dumps(data))
    return artifact(edit)


def cut(rel: str, keep: Callable[[int], int]):
    def edit(root: Path):
        data = (root / rel).read_bytes()
        (root / rel).write_bytes(data[:keep(len(data))])
    return artifact(edit)


def replace_file(rel: str, data: bytes | str | Path | None):
    """Artifact file REL replaced by data (bytes, text, a copy of a path) or removed (None)."""
    def edit(root: Path):
        path = root / rel
        path.unlink()
        if isinstance(data, Path):
            shutil.copyfile(data, path)
        elif data is not None:
            path.write_bytes(data.encode() if isinstance(data, str) else data)
    return artifact(edit)


def read_only(name: str):
    def setup(e: Env):
        e.mount(e.t / name, "ro,size=64k")
    return setup


def full(name: str, fill: bool = True):
    """A 64 KiB tmpfs at t/NAME, filled to the last byte by a file of the user's (unless ``fill`` is off)."""
    def setup(e: Env):
        e.mount(e.t / name, "size=64k")
        if fill:
            fd = os.open(e.t / name / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while os.write(fd, b"\0" * 4096):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
    return setup


#: the session of a database tuned for linux-arm64 in float32 (what compile --db reads before the model)
ARM_SESSION = json.dumps({"schema": "agoc.tunedb/1", "model_sha256": "0" * 64, "settings": {},
                          "target": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76",
                                     "mattr": ["+neon"], "num-cores": 4}})


def tune_db(session: str):
    def setup(e: Env):
        (e.t / "db").mkdir()
        (e.t / "db" / "session.json").write_text(session)
    return setup


def both(*setups):
    def setup(e: Env):
        for s in setups:
            s(e)
    return setup


# ----------------------------------------------------------------------------- models with a flaw


def graph_model(nodes, inputs, outputs, inits=(), opset=OPSET, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=imports, ir_version=IR_VERSION)


def relu_model(dims=(1, 4), elem=TensorProto.FLOAT, op="Relu", domain="", opset=OPSET):
    node = helper.make_node(op, ["x"], ["y"], name="n0", domain=domain)
    return graph_model([node], [helper.make_tensor_value_info("x", elem, list(dims))],
                       [helper.make_tensor_value_info("y", elem, list(dims))], opset=opset,
                       domains=[domain] if domain else [])


def undefined_input_model():
    node = helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")
    return graph_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])


def no_nodes_model():
    return graph_model([], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])])


def unsupported_op_model():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["y"], name="nms")
    return graph_model(
        [node],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 8, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [8, 3])])


def external_data_model(e: Env):
    """A model whose weight lives in an external file that is not there."""
    import numpy as np

    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    model = graph_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits=[weight])
    onnx.save(model, str(e.t / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    (e.t / "weights.bin").unlink()


# ----------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    fragment: str  # in the error line
    setup: Optional[Callable[[Env], None]] = None
    code: int = 1
    usage: bool = False  # typer's own usage error (its panel, not agoc's one line)
    env: tuple[tuple[str, str], ...] = ()
    phone: bool = False  # an adb server with no phone attached
    cwd: str = ""  # the working directory, relative to the scratch directory


def case(id: str, argv, fragment: str, setup=None, xfail: Optional[str] = None, **kw):
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(Case(tuple(argv), fragment, setup, **kw), id=id, marks=marks)


OUT = ("-o", "{t}/out")
LONG = "m" * 250 + ".onnx"
TOO_LONG = "m" * 300 + ".onnx"


def _compile_cases():
    c = []
    for label, data, fragment in [
        ("empty-file", b"", "ONNX"), ("garbage", GARBAGE, "ONNX"), ("text", "hello, this is not a model\n", "ONNX"),
        ("zeros", b"\0" * 1000, "ONNX"), ("json", '{"graph": {}}', "ONNX"),
    ]:
        c.append(case(f"compile-{label}", ["compile", "{t}/m.onnx", *OUT], fragment, write("m.onnx", data)))
    for at in (1, 16, 200, "half", -1):
        keep = (lambda n: n // 2) if at == "half" else (lambda n, at=at: n + at if at < 0 else at)
        c.append(case(f"compile-truncated-at-{at}", ["compile", "{t}/m.onnx", *OUT], "ONNX", truncated("m.onnx", keep)))
    c += [
        case("compile-missing-file", ["compile", "{t}/nope.onnx", *OUT], "no such file"),
        case("compile-dev-null", ["compile", "/dev/null", *OUT], "ONNX"),
        case("compile-directory-as-model", ["compile", "{t}/m.onnx", *OUT], "is a directory", mkdir("m.onnx")),
        case("compile-symlink-loop", ["compile", "{t}/loop.onnx", *OUT], "no such file",
             symlink("loop.onnx", "loop.onnx")),
        case("compile-name-$(touch pwned)", ["compile", "{t}/$(touch pwned).onnx", *OUT], "pwned",
             write("$(touch pwned).onnx")),
        case("compile-name-backticks", ["compile", "{t}/`touch pwned`.onnx", *OUT], "pwned",
             write("`touch pwned`.onnx")),
        case("compile-name-semicolon-rm", ["compile", "{t}/x; rm -rf ~; touch pwned.onnx", *OUT], "rm -rf",
             write("x; rm -rf ~; touch pwned.onnx")),
        case("compile-name-spaces", ["compile", "{t}/my model v2 .onnx", *OUT], "my model v2",
             write("my model v2 .onnx")),
        case("compile-name-newline", ["compile", "{t}/a\nb.onnx", *OUT], "ONNX", write("a\nb.onnx")),
        case("compile-name-quotes", ["compile", "{t}/it's \"x\".onnx", *OUT], "it's", write("it's \"x\".onnx")),
        case("compile-name-unicode", ["compile", "{t}/模型 ü 🚀.onnx", *OUT], "模型", write("模型 ü 🚀.onnx")),
        case("compile-name-250-chars", ["compile", f"{{t}}/{LONG}", *OUT], "ONNX", write(LONG)),
        case("compile-name-too-long", ["compile", f"{{t}}/{TOO_LONG}", *OUT], "too long"),
        case("compile-name-leading-dash", ["compile", *OUT, "--", "-x.onnx"], "-x.onnx", write("-x.onnx")),
        case("compile-name-leading-dash-as-option", ["compile", "-x.onnx", *OUT], "No such option", write("-x.onnx"),
             usage=True),
        case("compile-untuned-unknown", ["compile", "{model}", *OUT, "--untuned", "fastest"],
             "choose one of: library, sampled, plain"),
        case("compile-library-with-untuned-plain", ["compile", "{model}", *OUT, "--untuned", "plain", "--library",
                                                    "{t}"], "--library is read only with --untuned library"),
        case("compile-library-not-a-library", ["compile", "{model}", *OUT, "--library", "{t}"], "library"),
        case("compile-no-model", ["compile", *OUT], "Missing argument", usage=True),
        case("compile-no-output", ["compile", "{model}"], "Missing option", usage=True),
        # destinations
        case("compile-o-below-a-file", ["compile", "{model}", "-o", "{t}/f.txt/out"], "cannot write",
             write("f.txt", "mine")),
        case("compile-o-is-a-file", ["compile", "{model}", "-o", "{t}/f.txt"], "is a file", write("f.txt", "mine")),
        case("compile-o-under-proc", ["compile", "{model}", "-o", "/proc/agoc-out"], "cannot write"),
        case("compile-o-under-proc-self", ["compile", "{model}", "-o", "/proc/self/agoc"], "cannot write"),
        case("compile-o-proc-file", ["compile", "{model}", "-o", "/proc/self/status"], "is a file"),
        case("compile-o-dev-null", ["compile", "{model}", "-o", "/dev/null"], "is a file"),
        case("compile-o-cwd", ["compile", "{model}", "-o", "."], "directory you are in"),
        case("compile-o-parent", ["compile", "{model}", "-o", ".."], "directory you are in"),
        case("compile-o-root", ["compile", "{model}", "-o", "/"], "directory you are in"),
        case("compile-o-etc", ["compile", "{model}", "-o", "/etc"], "not an agoc artifact"),
        case("compile-o-user-dir", ["compile", "{model}", "-o", "{t}/site"], "index.html", user_dir("site")),
        case("compile-o-user-dir-with-manifest", ["compile", "{model}", "-o", "{t}/site"], "not an agoc artifact",
             user_dir("site", '{"name": "my web app", "start_url": "/"}')),
        case("compile-o-user-dir-agoc-schema", ["compile", "{model}", "-o", "{t}/site"], "index.html",
             user_dir("site", '{"schema": "agoc.artifact/1"}')),
        case("compile-o-dot-inside-an-artifact", ["compile", "{model}", "-o", "."], "directory you are in", artifact(),
             cwd="art"),
        case("compile-o-an-artifact-bad-model", ["compile", "{t}/m.onnx", "-o", "{t}/art"], "ONNX",
             both(artifact(), write("m.onnx"))),
        case("compile-o-artifact-plus-notes", ["compile", "{model}", "-o", "{t}/art"], "notes.txt",
             artifact(lambda root: (root / "notes.txt").write_text("mine"))),
        case("compile-o-artifact-plus-subdir", ["compile", "{model}", "-o", "{t}/art"], "plots",
             artifact(lambda root: (root / "plots").mkdir())),
        case("compile-o-symlink-to-dir", ["compile", "{model}", "-o", "{t}/link"], "symbolic link",
             both(mkdir("real"), symlink("link", "real"))),
        case("compile-o-dangling-symlink", ["compile", "{model}", "-o", "{t}/link"], "symbolic link",
             symlink("link", "/nonexistent/agoc")),
        case("compile-o-read-only", ["compile", "{model}", "-o", "{t}/ro/out"], "cannot write", read_only("ro")),
        case("compile-o-full", ["compile", "{model}", "-o", "{t}/full/out"], "space", full("full", fill=False)),
        case("compile-o-missing-parents-bad-model", ["compile", "{t}/m.onnx", "-o", "{t}/a/b/c/out"], "ONNX",
             write("m.onnx")),
        case("compile-o-250-char-name-bad-model", ["compile", "{t}/m.onnx", "-o", "{t}/" + "o" * 250], "ONNX",
             write("m.onnx")),
        case("compile-o-hostile-name-bad-model", ["compile", "{t}/m.onnx", "-o", "{t}/$(touch pwned);rm -rf ~"], "ONNX",
             write("m.onnx")),
        # option values
        case("compile-threshold-negative", ["compile", "{model}", *OUT, "--threshold", "-1"], "--threshold"),
        case("compile-threshold-zero", ["compile", "{model}", *OUT, "--threshold", "0"], "--threshold"),
        case("compile-threshold-nan", ["compile", "{model}", *OUT, "--threshold", "nan"], "--threshold"),
        case("compile-threshold-not-a-number", ["compile", "{model}", *OUT, "--threshold", "abc"], "--threshold",
             usage=True),
        case("compile-keep-inside-negative", ["compile", "{model}", *OUT, "--keep-inside", "-5"], "--keep-inside"),
        case("compile-unknown-target", ["compile", "{model}", *OUT, "--target", "pixel-9"], "unknown target"),
        case("compile-empty-target", ["compile", "{model}", *OUT, "--target", ""], "unknown target"),
        case("compile-unknown-layout", ["compile", "{model}", *OUT, "--layout", "NWHC"], "layout"),
        case("compile-unknown-partition", ["compile", "{model}", *OUT, "--partition", "greedy"], "partition"),
        case("compile-unknown-precision", ["compile", "{model}", *OUT, "--precision", "bf16"], "unknown precision"),
        case("compile-fp16-with-an-fp32-db", ["compile", "{model}", *OUT, "--precision", "fp16", "--db", "{t}/db"],
             "tuned in fp32; tune them with `agoc tune --precision fp16`", tune_db(ARM_SESSION)),
        *([case("compile-fp16-on-x86", ["compile", "{model}", *OUT, "--precision", "fp16"], "needs FP16 arithmetic")]
          if platform.machine() == "x86_64" else []),
        case("compile-num-cores-zero", ["compile", "{model}", *OUT, "--num-cores", "0"], "--num-cores"),
        case("compile-num-cores-negative", ["compile", "{model}", *OUT, "--num-cores", "-4"], "--num-cores"),
        case("compile-unknown-mcpu", ["compile", "{model}", *OUT, "--mcpu", "pentium-9000"], "pentium-9000"),
        case("compile-joins-without-db", ["compile", "{model}", *OUT, "--joins", "a76"], "--db"),
        case("compile-db-missing", ["compile", "{model}", *OUT, "--db", "{t}/nodb"], "not a tuning database"),
        case("compile-db-is-a-file", ["compile", "{model}", *OUT, "--db", "{t}/f.txt"], "not a tuning database",
             write("f.txt", "mine")),
        case("compile-db-an-artifact", ["compile", "{model}", *OUT, "--db", "{t}/art"], "not a tuning database",
             artifact()),
        case("compile-db-corrupt-session", ["compile", "{model}", *OUT, "--db", "{t}/db"], "corrupt",
             tune_db("{not json")),
        case("compile-db-session-is-a-list", ["compile", "{model}", *OUT, "--db", "{t}/db"], "session.json",
             tune_db("[]")),
        case("compile-db-session-without-settings", ["compile", "{model}", *OUT, "--db", "{t}/db"], "session.json",
             tune_db('{"schema": "x"}')),
        case("compile-seed-negative", ["compile", "{model}", *OUT, "--seed", "-1"], "--seed"),
        case("compile-inputs-missing", ["compile", "{model}", *OUT, "--inputs", "{t}/nope.npz"], "--inputs"),
        case("compile-inputs-garbage", ["compile", "{model}", *OUT, "--inputs", "{t}/g.npz"], "--inputs",
             write("g.npz")),
        case("compile-dump-dir-is-a-file", ["compile", "{model}", *OUT, "--dump-dir", "{t}/f.txt"], "--dump-dir",
             write("f.txt", "mine")),
        # input shapes
        case("compile-shape-zero-dim", ["compile", "{model}", *OUT, "-s", "input=1x3x0x16"], "input"),
        case("compile-shape-huge", ["compile", "{t}/dyn.onnx", *OUT, "-s", "x=1x3x100000x100000"], "GiB",
             onnx_file("dyn.onnx", lambda: relu_model(("N", "C", "H", "W")))),
        case("compile-shape-not-numbers", ["compile", "{model}", *OUT, "-s", "input=axbxc"], "input"),
        case("compile-shape-unknown-input", ["compile", "{model}", *OUT, "-s", "nosuch=1x3x16x16"], "nosuch"),
        case("compile-shape-negative", ["compile", "{model}", *OUT, "-s", "input=-1x3x16x16"], "input"),
        case("compile-shape-empty", ["compile", "{model}", *OUT, "-s", "input="], "input"),
        case("compile-shape-conflicts", ["compile", "{model}", *OUT, "-s", "1x3x32x32"], "conflicts"),
        case("compile-shape-wrong-rank", ["compile", "{model}", *OUT, "-s", "input=1x3x16"], "input"),
        case("compile-zoo-unknown", ["compile", "zoo:resnet-9000", *OUT], "resnet-9000"),
        case("compile-zoo-empty-name", ["compile", "zoo:", *OUT], "models list"),
        case("compile-zoo-bad-shape", ["compile", "zoo:tiny-cnn@abc", *OUT], "shape"),
        case("compile-zoo-zero-shape", ["compile", "zoo:tiny-cnn@1x3x0x16", *OUT], "shape"),
        case("compile-zoo-huge-shape", ["compile", "zoo:tiny-cnn@1x3x100000x100000", *OUT], "too large"),
        # models with a flaw
        case("compile-model-zero-dim", ["compile", "{t}/z.onnx", *OUT], "zero-size",
             onnx_file("z.onnx", lambda: relu_model((1, 0, 4)))),
        case("compile-model-missing-external-data", ["compile", "{t}/ext.onnx", *OUT], "weights.bin",
             external_data_model),
        case("compile-model-unsupported-op", ["compile", "{t}/nms.onnx", *OUT], "NonMaxSuppression",
             onnx_file("nms.onnx", unsupported_op_model)),
        case("compile-model-custom-domain-relu", ["compile", "{t}/c.onnx", *OUT], "com.evil",
             onnx_file("c.onnx", lambda: relu_model(domain="com.evil"))),
        case("compile-model-opset-99", ["compile", "{t}/o.onnx", *OUT], "opset",
             onnx_file("o.onnx", lambda: relu_model(opset=99))),
        case("compile-model-bfloat16", ["compile", "{t}/b.onnx", *OUT], "bfloat16",
             onnx_file("b.onnx", lambda: relu_model(elem=TensorProto.BFLOAT16))),
        case("compile-model-undefined-input", ["compile", "{t}/u.onnx", *OUT], "re-export",
             onnx_file("u.onnx", undefined_input_model)),
        case("compile-model-no-nodes", ["compile", "{t}/e.onnx", *OUT], "nodes", onnx_file("e.onnx", no_nodes_model)),
        case("compile-hostile-model-zero-dim", ["compile", "{hostile}", *OUT, "-s", f"{HOSTILE_INPUT}=1x3x0x16"],
             "positive"),
        case("compile-hostile-model-unknown-input", ["compile", "{hostile}", *OUT, "-s", "input=1x3x16x16"],
             HOSTILE_INPUT),
        case("compile-hostile-model-o-a-file", ["compile", "{hostile}", "-o", "{hostile}"], "is a file"),
        case("compile-cuda-o-user-dir", ["compile", "zoo:tiny-cnn", "--target", "cuda", "-o", "{t}/site"], "index.html",
             user_dir("site")),
        case("compile-cuda-o-under-proc", ["compile", "zoo:tiny-cnn", "--target", "cuda", "-o", "/proc/x"],
             "cannot write"),
        case("compile-cuda-garbage-model", ["compile", "{t}/m.onnx", *OUT, "--target", "cuda"], "ONNX",
             write("m.onnx")),
    ]
    return c


def _verify_cases():
    c = []
    for command in ("verify", "inspect", "deploy", "bench"):
        extra = ("--device", "local") if command in ("deploy", "bench") else ()
        for label, setup, fragment in [
            ("missing-dir", None, "no artifact directory" if command != "inspect" else "no such file"),
            ("manifest-is-a-list", manifest_text("[]"), "manifest.json"),
            ("library-truncated", cut("model.so", lambda n: n // 2), "damaged"),
        ]:
            c.append(case(f"{command}-{label}", [command, "{t}/art", *extra], fragment, setup))
    for label, setup, fragment in [
        ("a-file", write("art", "mine"), "no artifact directory"),
        ("empty-dir", mkdir("art"), "no manifest.json"),
        ("user-dir", user_dir("art"), "no manifest.json"),
        ("manifest-not-json", manifest_text("{oops"), "not valid JSON"),
        ("manifest-empty", manifest_text(""), "not valid JSON"),
        ("manifest-is-an-object", manifest_text("{}"), "schema"),
        ("manifest-is-a-string", manifest_text('"agoc.artifact/1"'), "manifest.json"),
        ("manifest-is-null", manifest_text("null"), "manifest.json"),
        ("manifest-is-a-number", manifest_text("42"), "manifest.json"),
        ("manifest-schema-only", manifest_text('{"schema": "agoc.artifact/1"}'), "missing"),
        ("manifest-old-schema", manifest_edit(lambda d: d.update(schema="agoc.artifact/0")), "schema"),
        ("manifest-cuda-schema", manifest_edit(lambda d: d.update(schema="agoc.cuda/1")), "schema"),
        ("manifest-inputs-a-string", manifest_edit(lambda d: d.update(inputs="x")), "manifest.json"),
        ("manifest-inputs-numbers", manifest_edit(lambda d: d.update(inputs=[1, 2])), "manifest.json"),
        ("manifest-shape-a-string", manifest_edit(lambda d: d["inputs"][0].update(shape="abc")), "shape"),
        ("manifest-shape-negative", manifest_edit(lambda d: d["inputs"][0].update(shape=[1, -3, 16, 16])), "shape"),
        ("manifest-dtype-unknown", manifest_edit(lambda d: d["inputs"][0].update(dtype="float128x")), "dtype"),
        ("manifest-library-a-number", manifest_edit(lambda d: d.update(library=7)), "manifest.json"),
        ("manifest-library-outside", manifest_edit(lambda d: d.update(library="/bin/ls")), "outside"),
        ("manifest-library-parent", manifest_edit(lambda d: d.update(library="../../../../../bin/ls")), "outside"),
        ("manifest-input-file-outside", manifest_edit(lambda d: d["inputs"][0].update(file="/etc/passwd")), "outside"),
        ("manifest-model-file-outside", manifest_edit(lambda d: d["model"].update(file="../tiny-cnn.onnx")), "outside"),
        ("library-missing", replace_file("model.so", None), "missing"),
        ("library-symlink-outside",
         artifact(lambda r: ((r / "model.so").unlink(), (r / "model.so").symlink_to("/bin/ls"))), "outside"),
        ("expected-truncated-no-model-copy",
         artifact(lambda r: ((r / "model.onnx").unlink(), (r / "data" / "expected_0.bin").write_bytes(b"\0" * 12))),
         "elements"),
        ("library-empty", replace_file("model.so", b""), "damaged"),
        ("library-cut-at-4096", cut("model.so", lambda n: 4096), "damaged"),
        ("library-text", replace_file("model.so", "#!/bin/sh\ntouch pwned\n"), "damaged"),
        ("library-a-directory", artifact(lambda r: ((r / "model.so").unlink(), (r / "model.so").mkdir())), "model.so"),
        ("input-missing", replace_file("data/input_0.bin", None), "missing"),
        ("input-truncated", cut("data/input_0.bin", lambda n: n - 4), "elements"),
        ("model-copy-edited", replace_file("model.onnx", REPO / "models" / "__init__.py"), "model.onnx"),
        ("model-copy-garbage", replace_file("model.onnx", GARBAGE), "model.onnx"),
        ("model-and-expected-missing",
         artifact(lambda r: ((r / "model.onnx").unlink(), (r / "data" / "expected_0.bin").unlink())), "missing"),
    ]:
        c.append(case(f"verify-{label}", ["verify", "{t}/art"], fragment, setup))
    c.append(case("verify-library-swapped-for-another-models", ["verify", "{t}/art"], "not the library",
                  lambda e: artifact(lambda r: shutil.copyfile(e.s.other / "model.so", r / "model.so"))(e)))
    if SYSTEM_SO:
        c.append(case("verify-library-swapped-for-libz", ["verify", "{t}/art"], "not the library",
                      replace_file("model.so", Path(SYSTEM_SO))))

        def libz_without_hash(e: Env):  # an artifact made before the library's hash was recorded
            replace_file("model.so", Path(SYSTEM_SO))(e)
            data = json.loads((e.t / "art" / "manifest.json").read_text())
            del data["library_sha256"]
            (e.t / "art" / "manifest.json").write_text(json.dumps(data))

        c.append(case("verify-library-swapped-for-libz-no-hash", ["verify", "{t}/art"], "model.so", libz_without_hash))
    c += [
        case("verify-atol-negative", ["verify", "{art}", "--atol", "-1"], "--atol"),
        case("verify-rtol-nan", ["verify", "{art}", "--rtol", "nan"], "--rtol"),
        case("verify-atol-not-a-number", ["verify", "{art}", "--atol", "tight"], "--atol", usage=True),
        case("verify-unknown-device", ["verify", "{art}", "--device", "pixel-9"], "unknown device", phone=True),
        case("verify-hostile-device", ["verify", "{art}", "--device", "$(touch pwned); rm -rf ~"], "unknown device",
             phone=True),
        case("verify-qemu-on-a-host-artifact", ["verify", "{art}", "--device", "qemu"], "ARM64"),
        case("verify-bad-adb-port", ["verify", "{art}", "--device", "emulator-5554"], "ANDROID_ADB_SERVER_PORT",
             env=(("ANDROID_ADB_SERVER_PORT", "not-a-port"),)),
    ]
    return c


def _inspect_cases():
    return [
        case("inspect-missing-file", ["inspect", "{t}/nope.onnx"], "no such file"),
        case("inspect-empty-file", ["inspect", "{t}/m.onnx"], "ONNX", write("m.onnx", b"")),
        case("inspect-garbage", ["inspect", "{t}/m.onnx"], "ONNX", write("m.onnx")),
        case("inspect-truncated", ["inspect", "{t}/m.onnx"], "ONNX", truncated("m.onnx", lambda n: n // 3)),
        case("inspect-empty-dir", ["inspect", "{t}/d"], "no manifest.json", mkdir("d")),
        case("inspect-user-dir", ["inspect", "{t}/site"], "no manifest.json", user_dir("site")),
        case("inspect-library-outside", ["inspect", "{t}/art"], "outside",
             manifest_edit(lambda d: d.update(library="/bin/ls"))),
        case("inspect-zoo-unknown", ["inspect", "zoo:nope"], "nope"),
        case("inspect-zoo-zero-shape", ["inspect", "zoo:tiny-cnn@0x0x0x0"], "shape"),
        case("inspect-shape-malformed", ["inspect", "{model}", "-s", "input=1x3xhuge"], "input"),
        case("inspect-hostile-model-unknown-input", ["inspect", "{hostile}", "-s", "nosuch=1x3x16x16"], HOSTILE_INPUT),
        case("inspect-hostile-name", ["inspect", "{t}/$(touch pwned)\n.onnx"], "pwned", write("$(touch pwned)\n.onnx")),
        case("inspect-leading-dash", ["inspect", "--", "-rf"], "-rf", write("-rf")),
    ]


def _partition_cases():
    return [
        case("partition-dot-is-a-dir", ["partition", "{model}", "--dot", "{t}/d"], "--dot", mkdir("d")),
        case("partition-dot-empty", ["partition", "{model}", "--dot", ""], "--dot"),
        case("partition-dot-below-a-file", ["partition", "{model}", "--dot", "{t}/f.txt/g.dot"], "--dot",
             write("f.txt", "mine")),
        case("partition-dot-under-proc", ["partition", "{model}", "--dot", "/proc/agoc.dot"], "--dot"),
        case("partition-dot-read-only", ["partition", "{model}", "--dot", "{t}/ro/g.dot"], "--dot", read_only("ro")),
        case("partition-dot-full", ["partition", "{model}", "--dot", "{t}/full/g.dot"], "space", full("full")),
        case("partition-hostile-model-dot-a-dir", ["partition", "{hostile}", "--dot", "{t}/d"], "--dot", mkdir("d")),
        case("partition-png-is-a-dir", ["partition", "{model}", "--png", "{t}/d"], "--png", mkdir("d")),
        case("partition-threshold-negative", ["partition", "{model}", "--threshold", "-3"], "--threshold"),
        case("partition-threshold-nan", ["partition", "{model}", "--threshold", "nan"], "--threshold"),
        case("partition-trivial-cut-nan", ["partition", "{model}", "--trivial-cut", "nan"], "--trivial-cut"),
        case("partition-trivial-cut-negative", ["partition", "{model}", "--trivial-cut", "-1"], "--trivial-cut"),
        case("partition-keep-inside-negative", ["partition", "{model}", "--keep-inside", "-1"], "--keep-inside"),
        case("partition-missing-model", ["partition", "{t}/nope.onnx"], "no such file"),
        case("partition-garbage-model", ["partition", "{t}/m.onnx"], "ONNX", write("m.onnx")),
        case("partition-zoo-unknown", ["partition", "zoo:nope"], "nope"),
        case("partition-unknown-layout", ["partition", "{model}", "--layout", "CHWN"], "layout"),
    ]


TUNE = ("tune", "{model}", "--db", "{t}/db")


def _tune_cases():
    return [
        case("tune-nothing", ["tune"], "--db"),
        case("tune-no-db", ["tune", "{model}"], "--db"),
        case("tune-db-is-a-file", ["tune", "{model}", "--db", "{t}/f.txt"], "f.txt", write("f.txt", "mine")),
        case("tune-db-user-dir", ["tune", "{model}", "--db", "{t}/site"], "not a tuning database", user_dir("site")),
        case("tune-db-an-artifact", ["tune", "{model}", "--db", "{t}/art"], "not a tuning database", artifact()),
        case("tune-db-under-proc", ["tune", "{model}", "--db", "/proc/agoc-db"], "agoc-db"),
        case("tune-db-read-only", ["tune", "{model}", "--db", "{t}/ro/db"], "db", read_only("ro")),
        case("tune-db-corrupt-session", [*TUNE], "corrupt", tune_db("{not json")),
        case("tune-db-session-is-a-list", [*TUNE], "session.json", tune_db("[]")),
        case("tune-unknown-precision", [*TUNE, "--precision", "fp8"], "unknown precision"),
        *([case("tune-fp16-on-x86", [*TUNE, "--precision", "fp16"], "needs FP16 arithmetic")]
          if platform.machine() == "x86_64" else []),
        case("tune-trials-zero", [*TUNE, "--trials", "0"], "--trials"),
        case("tune-trials-negative", [*TUNE, "--trials", "-5"], "--trials"),
        case("tune-per-iter-zero", [*TUNE, "--per-iter", "0"], "--per-iter"),
        case("tune-warmup-zero", [*TUNE, "--warmup", "0"], "--warmup"),
        case("tune-population-too-small", [*TUNE, "--population", "1"], "--population"),
        case("tune-threshold-negative", [*TUNE, "--threshold", "-1"], "--threshold"),
        case("tune-threshold-nan", [*TUNE, "--threshold", "nan"], "--threshold"),
        case("tune-split-fraction-two", [*TUNE, "--split-fraction", "2"], "--split-fraction"),
        case("tune-split-fraction-nan", [*TUNE, "--split-fraction", "nan"], "--split-fraction"),
        case("tune-roof-above-one", [*TUNE, "--roof", "1.5"], "--roof"),
        case("tune-roof-nan", [*TUNE, "--roof", "nan"], "--roof"),
        case("tune-max-spread-zero", [*TUNE, "--max-spread", "0"], "--max-spread"),
        case("tune-cooldown-negative", [*TUNE, "--cooldown", "-1"], "--cooldown"),
        case("tune-unknown-partition", [*TUNE, "--partition", "greedy"], "greedy"),
        case("tune-unknown-scheduler", [*TUNE, "--scheduler", "fifo"], "fifo"),
        case("tune-transfer-negative", [*TUNE, "--transfer", "-1"], "--transfer"),
        case("tune-keep-inside-negative", [*TUNE, "--keep-inside", "-1"], "--keep-inside"),
        case("tune-unknown-target", [*TUNE, "--target", "pixel-9"], "unknown target"),
        case("tune-unknown-layout", [*TUNE, "--layout", "HWCN"], "layout"),
        case("tune-garbage-model", ["tune", "{t}/m.onnx", "--db", "{t}/db"], "ONNX", write("m.onnx")),
        case("tune-unknown-device", [*TUNE, "--device", "pixel-9"], "unknown device", phone=True),
        case("tune-from-missing", [*TUNE, "--from", "{t}/nodb"], "nodb"),
        case("tune-tracker-without-key", [*TUNE, "--tracker", "127.0.0.1:9"], "--key"),
        case("tune-against-without-status", [*TUNE, "--against", "{t}/other"], "--status"),
        case("tune-status-missing", ["tune", "--status", "{t}/nodb"], "nodb"),
        case("tune-status-a-file", ["tune", "--status", "{t}/f.txt"], "f.txt", write("f.txt", "mine")),
        case("tune-status-user-dir", ["tune", "--status", "{t}/site"], "not a tuning database", user_dir("site")),
    ]


def _deploy_bench_cases():
    return [
        case("deploy-no-phone", ["deploy", "{art}"], "no device", phone=True),
        case("deploy-unknown-device", ["deploy", "{art}", "--device", "pixel-9"], "unknown device", phone=True),
        case("deploy-hostile-device", ["deploy", "{art}", "--device", "; touch pwned"], "unknown device", phone=True),
        case("deploy-qemu-host-artifact", ["deploy", "{art}", "--device", "qemu"], "ARM64"),
        case("deploy-arm-artifact-on-local", ["deploy", "{t}/art", "--device", "local"], "linux-arm64",
             manifest_edit(lambda d: (d["target"].update(preset="linux-arm64"),
                                      d["target"]["tvm_target"].update(mtriple="aarch64-linux-gnu")))),
        case("deploy-user-dir", ["deploy", "{t}/site", "--device", "local"], "no manifest.json", user_dir("site")),
        case("bench-arm-artifact-no-phone", ["bench", "{t}/art"], "no device",
             manifest_edit(lambda d: (d["target"].update(preset="linux-arm64"),
                                      d["target"]["tvm_target"].update(mtriple="aarch64-linux-gnu"))), phone=True),
        case("bench-unknown-device", ["bench", "{art}", "--device", "pixel-9"], "unknown device", phone=True),
        case("bench-cores-not-numbers", ["bench", "{art}", "--device", "local", "--cores", "big"], "--cores"),
        case("bench-cores-empty-item", ["bench", "{art}", "--device", "local", "--cores", "1,,2"], "--cores"),
        case("bench-cores-negative", ["bench", "{art}", "--device", "local", "--cores", "-1"], "--cores"),
        case("bench-repeat-zero", ["bench", "{art}", "--device", "local", "--repeat", "0"], "--repeat"),
        case("bench-warmup-negative", ["bench", "{art}", "--device", "local", "--warmup", "-1"], "--warmup"),
        case("bench-threads-zero", ["bench", "{art}", "--device", "local", "--threads", "0"], "--threads"),
        case("bench-min-time-nan", ["bench", "{art}", "--device", "local", "--min-time-ms", "nan"], "--min-time-ms"),
        case("bench-unknown-proxy", ["bench", "{art}", "--proxy", "a99"], "a99"),
        case("bench-proxy-on-qemu", ["bench", "{art}", "--proxy", "a76", "--device", "qemu"], "--device"),
        case("bench-proxy-repeat-zero", ["bench", "{art}", "--proxy", "a76", "--repeat", "0"], "--repeat"),
        case("bench-manifest-object", ["bench", "{t}/art", "--device", "local"], "schema", manifest_text("{}")),
    ]


def _export_cases():
    return [
        case("export-unknown-model", ["models", "export", "resnet-9000", "-o", "{t}/m.onnx"], "resnet-9000"),
        case("export-hostile-model-name", ["models", "export", "$(touch pwned)", "-o", "{t}/m.onnx"], "pwned"),
        case("export-shape-not-numbers", ["models", "export", "tiny-cnn", "--shape", "big", "-o", "{t}/m.onnx"],
             "shape"),
        case("export-shape-zero", ["models", "export", "tiny-cnn", "--shape", "0x0", "-o", "{t}/m.onnx"], "shape"),
        case("export-shape-negative", ["models", "export", "tiny-cnn", "--shape", "-1x3x8x8", "-o", "{t}/m.onnx"],
             "shape"),
        case("export-shape-wrong-rank", ["models", "export", "tiny-cnn", "--shape", "1x3", "-o", "{t}/m.onnx"],
             "shape"),
        case("export-o-a-directory", ["models", "export", "tiny-cnn", "-o", "{t}/d"], "directory", mkdir("d")),
        case("export-o-empty", ["models", "export", "tiny-cnn", "-o", ""], "directory"),
        case("export-o-below-a-file", ["models", "export", "tiny-cnn", "-o", "{t}/f.txt/m.onnx"], "f.txt",
             write("f.txt", "mine")),
        case("export-o-under-proc", ["models", "export", "tiny-cnn", "-o", "/proc/agoc.onnx"], "/proc"),
        case("export-o-read-only", ["models", "export", "tiny-cnn", "-o", "{t}/ro/m.onnx"], "ro", read_only("ro")),
        case("export-o-full", ["models", "export", "tiny-cnn", "-o", "{t}/full/m.onnx"], "space", full("full")),
    ]


CASES = [*_compile_cases(), *_verify_cases(), *_inspect_cases(), *_partition_cases(), *_tune_cases(),
         *_deploy_bench_cases(), *_export_cases()]


# ----------------------------------------------------------------------------- the check


def snapshot(root: Path) -> dict:
    """Every entry under ``root``: files with size and mtime, links with their target, directories by name."""
    seen = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[rel] = ("dir",)
            else:
                st = path.stat()
                seen[rel] = ("file", st.st_size, st.st_mtime_ns)
    return seen


def pwned(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        if root.is_dir():
            found += [str(p) for p in root.rglob("*") if p.name == "pwned"]
    return found


def expand(arg: str, e: Env) -> str:
    for key, value in (("{t}", e.t), ("{model}", e.s.model), ("{art}", e.s.art), ("{hostile}", e.s.hostile)):
        arg = arg.replace(key, str(value))
    return arg


@pytest.mark.parametrize("c", CASES)
def test_bad_input(c: Case, cli, tmp_path, shared, mounts, monkeypatch, request):
    t = tmp_path / "w"
    t.mkdir()
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    if c.phone:
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(request.getfixturevalue("no_phone").port))
    for key, value in c.env:
        monkeypatch.setenv(key, value)
    e = Env(t, shared, mounts)
    if c.setup:
        c.setup(e)
    monkeypatch.chdir(t / c.cwd)
    before = snapshot(t), snapshot(shared.root)

    result = cli(*(expand(a, e) for a in c.argv))

    out, err = result.stdout, result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == c.code, (out, err)
    assert "Traceback" not in out + err, err
    if c.usage:
        assert "Usage:" in err and c.fragment in err, err
    else:
        *echo, line = [ln for ln in err.splitlines() if ln.strip()] or [""]
        assert all(ln.startswith(ECHO) for ln in echo), err
        assert line.startswith("error: "), err
        assert c.fragment in line, line
        assert FIX.search(line), f"names no fix: {line}"
        assert not UNFORMATTED.search(line), f"a placeholder left unformatted: {line}"
    assert (snapshot(t), snapshot(shared.root)) == before, "a file was touched"
    assert not pwned(t, shared.root) and not [p for p in (REPO / "pwned", Path("/tmp/pwned")) if p.exists()]


def test_the_corpus_is_large_enough():
    per_command = {}
    for p in CASES:
        per_command[p.values[0].argv[0]] = per_command.get(p.values[0].argv[0], 0) + 1
    assert len(CASES) >= 110 and all(per_command.get(k, 0) >= 5 for k in
                                     ("compile", "verify", "inspect", "partition", "tune", "deploy", "bench", "models"))


def test_the_shared_artifact_with_hostile_names_verifies(cli, shared, tmp_path, monkeypatch):
    """The valid model with shell metacharacters in its names compiled (module fixture), verifies, inspects,
    and nothing ran a shell on its names."""
    monkeypatch.chdir(tmp_path)
    result = cli("verify", shared.art, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] and report["outputs"][0]["name"] == HOSTILE_OUTPUT
    result = cli("inspect", shared.hostile, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["inputs"][0]["name"] == HOSTILE_INPUT
    assert not pwned(tmp_path, shared.root) and not (REPO / "pwned").exists()
