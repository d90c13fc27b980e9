"""The `agoc` command line: the typer app, its error guard and signals, and the commands' registration.
A user-caused failure (AgocError) is one red line with its fix and exit code 1; anything else is a bug, exit 2."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading

# TVM's CPU thread pool reads this once; unset, it uses half the hardware threads
# (1 on a 2-core machine), silently halving every measurement (design §3).
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import typer  # noqa: E402
from rich.markup import escape  # noqa: E402

from host.commands import artifact, bench, devices, library, models, partition, tracker, tune  # noqa: E402
from host.commands import compile as compile_  # noqa: E402
from host.console import console, err_console  # noqa: E402,F401  (tests set their width through this module)
from toolchain.errors import AgocError  # noqa: E402

# exit codes: 0 success, 1 anything the user can fix (click's usage errors included: click says 2), 2 our
# bugs, 130 Ctrl-C, 143 SIGTERM
# (typer 0.29 carries its own click; its UsageError is the base of every bad-parameter error)
next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError").exit_code = 1

# plain click help: rich's panels squeeze each option's help into a narrow column at 80 columns, and read
# "[@SHAPE]" in a help text as markup
app = typer.Typer(
    name="agoc",
    help="Compile ONNX models into fused, tuned kernels for ARM64 phones (and check them against onnxruntime).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
models_app = typer.Typer(help="The built-in model zoo.", no_args_is_help=True, rich_markup_mode=None)
tracker_app = typer.Typer(
    help="A farm of devices: TVM's RPC tracker, and devices serving it (see README, 'RPC tuning').",
    no_args_is_help=True,
    rich_markup_mode=None,
)
library_app = typer.Typer(
    help="Record libraries: the verified schedules of many tuning databases, seeds for `agoc tune`.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
_state = {"debug": False, "signalled": 0}  # signalled: the exit code of a Ctrl-C or SIGTERM received (130, 143)


def _guard(func):
    """Render AgocError as one line (exit 1), other exceptions as an internal error (exit 2)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt as exc:
            _stop(getattr(exc, "exit_code", 130))
        except Exception as exc:
            if _state["signalled"]:  # raised in a callback from TVM, which hands it back as a RuntimeError (wrapped
                _stop(_state["signalled"])  # in a BuildError by the stage that called it): still an interrupt
            _report(exc)

    return wrapper


def _report(exc: Exception) -> None:
    """A user's problem as one line (exit 1), anything else as an internal error (exit 2)."""
    if isinstance(exc, AgocError):
        _fail(exc, _one_line(str(exc)))
    if isinstance(exc, (OSError, MemoryError)):  # the machine's state, not agoc's logic: a path, a permission, space
        _fail(exc, _one_line(_os_message(exc)))
    if _state["debug"]:
        raise exc
    err_console.print(
        f"[bold red]internal error:[/bold red] {escape(type(exc).__name__)}: {escape(str(exc)[:500])}\n"
        "rerun with --debug for the traceback and report it",
        soft_wrap=True,
    )
    raise typer.Exit(2) from None


def _fail(exc: BaseException, message: str) -> None:
    """A failure the user can fix: one red line, exit 1 (with --debug: the traceback)."""
    if _state["debug"]:
        raise exc
    err_console.print(f"[bold red]error:[/bold red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(1) from None


def _one_line(message: str) -> str:
    """An error message as the one line it must be: control characters (a newline or tab in a file or tensor
    name the message quotes) shown escaped, as Python writes them in a string."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message.strip())


def _os_message(exc: BaseException) -> str:
    """One line for an operating-system error, naming the path and what to do."""
    if isinstance(exc, MemoryError):
        return "out of memory: the model or its input shapes are too large for this machine; give smaller " \
               "shapes with --input-shape"
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"{exc.strerror or exc}{where}: check the path, its permissions and the free disk space"


#: seconds a command has to unwind after Ctrl-C or SIGTERM (its context managers: a progress display, a device
#: session stopping the phone's runner over adb) before it is ended regardless
STOP_GRACE_S = 10.0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""

    exit_code = 143


def _on_signal(signum, frame):
    """Ctrl-C or SIGTERM: remembered (TVM hands an exception raised in one of its Python callbacks back as a
    RuntimeError) and raised as KeyboardInterrupt or :class:`Terminated`."""
    import signal

    code = 143 if signum == signal.SIGTERM else 130
    if not _state["signalled"]:  # a deadline for the unwinding (a lock a worker thread holds can stall it)
        _arm_deadline(code)
    _state["signalled"] = code
    raise Terminated() if code == 143 else KeyboardInterrupt()


def _arm_deadline(code: int) -> None:
    """End the process with ``code`` STOP_GRACE_S from now unless it has ended by then."""
    deadline = threading.Timer(STOP_GRACE_S, _stop, args=(code, False))
    deadline.daemon = True  # a command that ends by itself first (`tracker serve`) is not held up
    deadline.start()


def _stop(code: int, unwound: bool = True) -> None:
    """End the process now, on Ctrl-C (130) or SIGTERM (143): staging directories removed, nothing else
    touched; a hard exit, so a build running in a worker thread does not hold it up. Not ``unwound``: from the
    signal's deadline, the main thread still unwinding (perhaps waiting on a lock): the message written plainly."""
    from toolchain.artifact import discard_staging

    discard_staging()
    _end_workers()
    word = "interrupted" if code == 130 else "terminated"
    if unwound:
        err_console.print(f"[yellow]{word}[/yellow]")
        sys.stdout.flush()
        sys.stderr.flush()
    else:
        os.write(2, f"{word}\n".encode())
    os._exit(code)


def _end_workers() -> None:
    """Kill every process this one started, and theirs (builder and runner workers, an RPC server, a suite's
    tune in a session of its own): one mid-build would go on after the hard exit and hold the caller's stdout and
    stderr open. A tracker that `agoc tracker start` detached is no longer a child once it has returned."""
    from host.tracker import kill_descendants

    kill_descendants(os.getpid())


def _version(value: bool):
    if value:
        from toolchain.pipeline import package_versions

        console.print(" ".join(f"{k} {v}" for k, v in package_versions().items()))
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print versions."),
):
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")


#: (typer app, command name, function), in the order `agoc --help` lists them
COMMANDS = [
    (app, "compile", compile_.compile),
    (app, "verify", artifact.verify),
    (app, "inspect", artifact.inspect),
    (app, "devices", devices.devices),
    (app, "doctor", devices.doctor),
    (app, "deploy", devices.deploy),
    (app, "bench", devices.bench),
    (app, "tune", tune.tune),
    (app, "partition", partition.partition),
    (app, "targets", devices.targets),
    (app, "bench-suite", bench.bench_suite),
    (app, "bench-report", bench.bench_report),
    (app, "bench-rpc", bench.bench_rpc),
    (app, "bench-cuda", bench.bench_cuda),
    (models_app, "list", models.list_models),
    (models_app, "export", models.export),
    (tracker_app, "start", tracker.start),
    (tracker_app, "status", tracker.status),
    (tracker_app, "stop", tracker.stop),
    (tracker_app, "serve", tracker.serve),
    (library_app, "build", library.build),
    (library_app, "show", library.show),
]
for _app, _name, _func in COMMANDS:
    _app.command(_name)(_guard(_func))
app.add_typer(models_app, name="models")
app.add_typer(tracker_app, name="tracker")
app.add_typer(library_app, name="library")


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored (nohup, workers)
        signal.signal(signal.SIGINT, _on_signal)
    app(prog_name="agoc")


if __name__ == "__main__":
    sys.exit(main())
