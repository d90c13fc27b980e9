"""An adb server stand-in for tests: the host protocol plus one emulated device (see server.py)."""

from tests.fakeadb.server import FakeAdbServer, FakeCpu, SandboxError

__all__ = ["FakeAdbServer", "FakeCpu", "SandboxError"]
