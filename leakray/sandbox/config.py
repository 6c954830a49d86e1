"""Limits one sandboxed run lives under. Defaults are evalplus-level: generous enough for
benchmark references, tight enough that a million hostile programs cannot hurt the host."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field


@dataclass
class SandboxConfig:
    timeout_s: float = 10.0  # wall clock per run (per case for `stdio`); CPU gets the same plus 1 s
    memory_mb: int = 2048  # address space of every Python process in the run
    java_memory_mb: int = 4096  # the JVM reserves far more address space than it touches
    java_heap_mb: int = 512  # -Xmx; must fit inside java_memory_mb with metaspace and code cache
    compile_grace_s: float = 20.0  # javac's share, added to the Java runners' wall limit
    max_procs: int = 64  # processes + threads per run (the JVM needs ~20)
    max_output_bytes: int = 1 << 20  # per stream; also the largest file a program may write
    tail_bytes: int = 4096  # how much of stdout/stderr a result keeps
    work_dir_mb: int = 64  # the private writable /tmp (tmpfs)
    python: str = field(default_factory=lambda: sys.executable)  # interpreter with the tests' deps
    java_home: str | None = None  # default: the `java` on PATH
    junit_classpath: str | None = None  # jars for `junit5`; default: $LEAKRAY_JUNIT_CLASSPATH or ~/.m2
    isolation: str = "auto"  # "auto" | "bwrap" | "unshare" | "none" (tests force the fallbacks)
    uid_base: int = 200000  # when root, each concurrent run gets its own unprivileged uid from here
    warm: bool = True  # Python runners fork from a warm interpreter per worker (root + bwrap only)
    # without bubblewrap, generated code would see (and, as root, write) the host filesystem:
    # constructing a Sandbox then fails unless this is set (`execute.allow_weak_isolation: true`)
    allow_weak_isolation: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> SandboxConfig:
        return cls(**(data or {}))
