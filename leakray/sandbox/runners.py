"""What each runner puts in the work dir and runs there.

A runner turns (program, tests) into files and a command line; `core` runs it under the
isolation and reads the harness's verdict. `stdio` is judged by the host instead (see core)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field

from leakray.sandbox import cds
from leakray.sandbox import java as J
from leakray.sandbox.config import SandboxConfig

HARNESS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness_py.py")
COMPILE_ERROR_RC = 97  # the run script's exit code when javac refuses the sources
JUNIT_DIR = "/tmp/.junit"  # where the jars are bound; java.POLICY grants it
# coreutils `timeout`: the Java program outlived its own limit. 124 when the JVM exits on the
# TERM; 137 when it is still shutting down a second later and `-k 1` kills it (seen in CI on a
# loaded 2-core machine: an infinite loop's run reported "failed"). Nothing else in the sandbox
# sends the JVM a SIGKILL but its CPU-time limit, which is outliving a limit too.
RUN_TIMEOUT_RCS = (124, 137)


_JUNIT4_IMPORT = re.compile(r"^\s*import\s+(static\s+)?org\.junit\.(?!jupiter\b|platform\b)", re.M)


class RunnerError(ValueError):
    """The request cannot be run by this runner (reported as status `error`)."""


@dataclass
class Plan:
    files: dict[str, str | bytes]  # bytes: compiled classes (the warm javac)
    argv: list[str]  # "{fd}" is replaced by the result channel's fd number
    memory_mb: int
    wall_s: float
    ro_binds: list[tuple[str, str]] = field(default_factory=list)
    mode: str | None = None  # the Python harness mode, when a warm zygote may run it instead
    # Java: javac's arguments (no -d, no sources) and the run's script once the classes are there,
    # when a warm javac (javac_warm.py) may compile instead of the plan's own javac step
    javac_args: list[str] | None = None
    warm_argv: list[str] | None = None


def python_plan(mode: str, program: str, tests: str, cfg: SandboxConfig, timeout: float) -> Plan:
    if mode == "pytest":  # NCB: tests use the program's names and `pytest` without importing either
        files = {"test_solution.py": "import pytest\n" + program + "\n\n" + tests + "\n"}
    else:  # apart: the harness runs the program's top level first, then checks, then the tests
        files = {"solution.py": program + "\n", "tests.py": tests + "\n"}
    return Plan(files, [cfg.python, "-I", HARNESS_PY, mode, "{fd}"], cfg.memory_mb, timeout, mode=mode)


def jvm_flags(cfg: SandboxConfig, prefix: str = "") -> list[str]:
    # explicit sizes for every big reservation, so the JVM starts under RLIMIT_AS
    flags = [f"-Xmx{cfg.java_heap_mb}m", "-Xss8m", "-XX:CompressedClassSpaceSize=64m",
             "-XX:MaxMetaspaceSize=256m", "-XX:ReservedCodeCacheSize=64m", "-XX:+UseSerialGC",
             "-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=1", "-XX:-UsePerfData", "-Xshare:auto",
             "-XX:ActiveProcessorCount=1"]
    return [prefix + f for f in flags]


def java_bin(cfg: SandboxConfig, tool: str) -> str:
    return os.path.join(cfg.java_home, "bin", tool) if cfg.java_home else tool


_JAVA_MAJOR: dict[str, int | None] = {}


def java_major(java: str) -> int | None:
    """The JDK's feature version (17 for "17.0.15"), once per binary; None when it cannot be told."""
    if java not in _JAVA_MAJOR:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
            match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
            major = int(match.group(1)) if match else None
            _JAVA_MAJOR[java] = match and (int(match.group(2)) if major == 1 else major)
        except (OSError, subprocess.SubprocessError, ValueError):
            _JAVA_MAJOR[java] = None
    return _JAVA_MAJOR[java]


def java_plan(mode: str, program: str, tests: str, cfg: SandboxConfig, timeout: float) -> Plan:
    major = java_major(java_bin(cfg, "java"))
    if major is not None and not 17 <= major <= 23:  # the verdict's wall is the SecurityManager
        raise RunnerError(f"the Java runners need JDK 17-23 (found {major}): JDK 24 removed the SecurityManager "
                          "that keeps the verdict from the program; set SandboxConfig.java_home")
    binds: list[tuple[str, str]] = []
    if mode == "junit5":
        jars = J.junit_jars(cfg.junit_classpath)
        if not jars:
            raise RunnerError("junit5 needs JUnit jars: run scripts/install.sh (Debian's junit5), or set "
                              "LEAKRAY_JUNIT_CLASSPATH or SandboxConfig.junit_classpath (none found in ~/.m2 "
                              "or /usr/share/java)")
        if _JUNIT4_IMPORT.search(tests) and not J.junit_has_vintage(jars):
            raise RunnerError("these tests are JUnit 4 (org.junit.*), which needs JUnit 4 and the vintage "
                              "engine beside Jupiter: run scripts/install.sh (Debian's junit5) or add them to "
                              "LEAKRAY_JUNIT_CLASSPATH")
        # bound under the work dir: the jars' own parents (~/.m2, mode 0750) are closed to the run's uid
        binds = [(os.path.realpath(j), f"{JUNIT_DIR}/{os.path.basename(j)}") for j in jars]
        trusted = J.manifest_codebases(jars, JUNIT_DIR)
        test_classes = J.type_names(tests)
        if not test_classes:
            raise RunnerError("no top-level class in the JUnit tests")
        harness, cp, extra = J.JUNIT_HARNESS, ":".join(b[1] for b in binds), test_classes
    else:
        harness, cp, extra, trusted = J.MAIN_HARNESS, "", [], []
    files = J.java_files(program, tests)
    for name in files:  # the harness's classes get every permission by where they live: keep the names ours
        if name.startswith("Leakray"):
            raise RunnerError(f"the sources define a type with the reserved prefix Leakray ({name[:-5]})")
    files["LeakrayHarness.java"] = harness
    files["LeakrayReport.java"] = J.REPORT
    files["leakray.policy"] = J.policy(trusted)
    sources = sorted(f for f in files if f.endswith(".java"))
    jflags = jvm_flags(cfg, "-J")
    archive = cds.javac_archive(java_bin(cfg, "javac"), jflags)
    if archive:
        binds.append((archive, "/tmp/.cds/javac.jsa"))
        jflags = jflags + ["-J-XX:SharedArchiveFile=/tmp/.cds/javac.jsa"]
    javac_args = ["-proc:none", "-nowarn", "-encoding", "UTF-8"] + (["-cp", cp] if cp else [])
    javac = [java_bin(cfg, "javac"), *jflags, *javac_args, "-d", "classes", *sources]
    # the harness's classes leave the program's class dir for .h/, which only they may use; the
    # program runs in run/, the one place it may write
    # javac reads the sources as UTF-8 whatever the locale; the run's default charset is pinned to UTF-8
    # as well rather than left to the locale the isolation sets, so getBytes(), readers and printing of
    # non-ASCII text (NCB's Chinese expected values) behave as under upstream's UTF-8 images
    java = [java_bin(cfg, "java"), *jvm_flags(cfg), "-Dfile.encoding=UTF-8", "-Djava.security.manager",
            '-Djava.security.policy==$W/leakray.policy', "-Dleakray.work=$W", "-Djava.io.tmpdir=$W/run",
            "-cp", "$W/.h:$W/classes" + (":" + cp if cp else ""), "LeakrayHarness", "{fd}", *extra]
    # javac gets the compile grace; the program only its own timeout (coreutils exits 124 on expiry)
    run = ["timeout", "-k", "1", f"{timeout:g}s", *java]
    exec_run = f"exec {' '.join(_sh_word(a) for a in run)}\n"
    script = (f"{shlex.join(javac)} 1>&2 || exit {COMPILE_ERROR_RC}\n"
              f"W=$PWD; mkdir .h run && mv {' '.join('classes/' + c for c in J.HARNESS_CLASSES)} .h/ "
              f"|| exit {COMPILE_ERROR_RC}\ncd run\n" + exec_run)
    # compiled by a warm javac, the classes arrive in classes/ and the harness's in .h/
    warm = f"W=$PWD; mkdir run || exit {COMPILE_ERROR_RC}\ncd run\n" + exec_run
    return Plan(files, ["/bin/sh", "-c", script], cfg.java_memory_mb, timeout + cfg.compile_grace_s, binds,
                javac_args=javac_args, warm_argv=["/bin/sh", "-c", warm])


def _sh_word(arg: str) -> str:
    """Quoted for sh, but with `$W` (the work dir, known only inside the run) expanded."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$").replace(
        "\\$W", "$W") + '"'


def stdio_cases(tests: str) -> list[tuple[str, str]]:
    """APPS-style {"inputs": [...], "outputs": [...]} -> [(stdin, expected stdout)]."""
    try:
        data = json.loads(tests)
    except json.JSONDecodeError as exc:
        raise RunnerError(f"stdio tests are not JSON ({exc.msg})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list) \
            or not isinstance(data.get("outputs"), list) or len(data["inputs"]) != len(data["outputs"]):
        raise RunnerError("stdio tests need equal-length lists 'inputs' and 'outputs'")
    if not data["inputs"]:
        raise RunnerError("stdio tests have no cases")

    def text(v) -> str:
        return "\n".join(map(str, v)) if isinstance(v, list) else str(v)
    return [(text(i), text(o)) for i, o in zip(data["inputs"], data["outputs"])]


def _tokens(s: str) -> list[str]:
    return s.split()


def outputs_match(got: str, want: str) -> bool:
    """APPS' leniency: trailing whitespace and blank lines never matter, then whitespace-split
    tokens, then numbers within 1e-6."""
    def lines(s: str) -> list[str]:
        out = [ln.rstrip() for ln in s.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out
    if lines(got) == lines(want):
        return True
    a, b = _tokens(got), _tokens(want)
    if a == b:
        return True
    if len(a) != len(b):
        return False
    try:
        return all(x == y or abs(float(x) - float(y)) <= 1e-6 * max(1.0, abs(float(y))) for x, y in zip(a, b))
    except ValueError:
        return False
