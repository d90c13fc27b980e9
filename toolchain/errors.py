"""One error type per stage, all derived from :class:`AgocError`.

The message is one line that says what is wrong and how to fix it; the CLI
prints it once and exits with code 1.
"""


class AgocError(Exception):
    """Base of every error agoc reports to a user (not a bug: a fixable condition)."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (its type's name when empty), at most ``limit``
    characters: what a one-line error or a recorded failure quotes of a library's exception."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


class ModelLoadError(AgocError):
    """The model file is missing, unreadable or not valid ONNX."""


class UnsupportedModelError(AgocError):
    """The model uses something agoc cannot compile (an op, a dynamic shape, a dtype)."""


class InputShapeError(AgocError):
    """``--input-shape`` is malformed or does not fit the model."""


class TargetError(AgocError):
    """Unknown target, bad target option, or a missing cross toolchain."""


class BuildError(AgocError):
    """TVM failed to lower or compile the model."""


class ArtifactError(AgocError):
    """An artifact directory is missing, incomplete or from an incompatible agoc."""


class DeviceError(AgocError):
    """A device cannot run the artifact (wrong architecture, missing, disconnected)."""


class SelfCheckError(AgocError):
    """The library just built disagrees with onnxruntime on the sample inputs (the artifact is not written)."""


class VerifyError(AgocError):
    """Verification could not run (not: the outputs differ; that is a failed report)."""
