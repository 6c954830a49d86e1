"""Isolated execution of untrusted programs against their tests (python, unittest, pytest,
java-main, junit5, stdio). See `core.Sandbox` and `isolation` for what the wall is made of."""

from leakray.sandbox.config import SandboxConfig
from leakray.sandbox.core import Sandbox

__all__ = ["Sandbox", "SandboxConfig"]
