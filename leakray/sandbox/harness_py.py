"""Runs inside the sandbox (stdlib + the test framework only): `python -I harness_py.py MODE RESULT_FD`.

A pass is a line `LEAKRAY <token> passed` on RESULT_FD, written only after the tests ran to the end.
The token is read from a file that is deleted before any untrusted code runs, and never printed, so
the program cannot forge the line by printing, by reading files, by exiting early (`exit()`,
`sys.exit`, `os._exit`: no line, or a `failed` line), or from an atexit hook (we leave with
`os._exit` right after reporting, so hooks never run). What the token does not stop is a program
that deliberately walks interpreter memory (gc, frames, /proc/self/mem) to find it; that needs
process separation between program and tests, which HumanEval-style tests do not allow.
"""

import os
import sys
import traceback

from posix import _exit as _EXIT  # bound before untrusted code can patch `os`
from posix import write as _WRITE

MODULE = "solution"


def _reporter(token: bytes, fd: int):
    def report(status: str, _w=_WRITE, _x=_EXIT, _t=token, _fd=fd) -> None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # a closed or replaced stream must not stop the report
            pass
        try:
            _w(_fd, b"LEAKRAY " + _t + b" " + status.encode() + b"\n")
        finally:
            _x(0)
    return report


def _load(path: str, name: str):
    import types

    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    code = compile(source, path, "exec")  # SyntaxError here is the harness's `error`
    module = types.ModuleType(name)
    module.__file__ = os.path.abspath(path)
    sys.modules[name] = module  # dataclasses, pickle and unittest look modules up by name
    return module, code


def run_python(report) -> None:
    module, code = _load(MODULE + ".py", MODULE)
    exec(code, module.__dict__)  # program then tests: an exception anywhere is a failure
    report("passed")


def _snapshot(classes):
    return [(cls, dict(vars(cls))) for cls in classes]


def _restore(snapshot) -> None:
    """Undo monkeypatching of the framework (a no-op assertEqual, an always-true wasSuccessful)."""
    for cls, attrs in snapshot:
        for name in [n for n in vars(cls) if n not in attrs]:
            delattr(cls, name)
        for name, value in attrs.items():
            if name not in ("__dict__", "__weakref__") and vars(cls).get(name) is not value:
                setattr(cls, name, value)


def run_unittest(report) -> None:
    import unittest

    framework = _snapshot([unittest.TestCase, unittest.TestResult, unittest.TextTestResult, unittest.TestSuite,
                           unittest.TestLoader, unittest.TextTestRunner])
    module, code = _load(MODULE + ".py", MODULE)
    exec(code, module.__dict__)
    _restore(framework)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=1).run(suite)
    ok = result.testsRun > 0 and result.wasSuccessful()
    report("passed" if ok else "failed")


def run_pytest(report) -> None:
    import pytest

    compile(open("test_solution.py", encoding="utf-8").read(), "test_solution.py", "exec")

    class Tally:  # counts from pytest's own reports, not from its exit code
        passed = failed = 0

        def pytest_runtest_logreport(self, report):
            if report.failed:
                Tally.failed += 1
            elif report.passed and report.when == "call":
                Tally.passed += 1

        def pytest_collectreport(self, report):
            if report.failed:
                Tally.failed += 1

    code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:pastebin", "--rootdir", os.getcwd(),
                        "-c", os.devnull, "test_solution.py"], plugins=[Tally()])
    ok = int(code) == 0 and Tally.passed > 0 and Tally.failed == 0
    report("passed" if ok else "failed")


MODES = {"python": run_python, "unittest": run_unittest, "pytest": run_pytest}


def stdio_main(path: str) -> None:
    """APPS: the program as `__main__` on this stdin; the host compares stdout. Exits like CPython."""
    sys.argv = [path]
    sys.path[0] = os.path.dirname(path)
    status = 0
    try:
        with open(path, encoding="utf-8") as fh:
            code = compile(fh.read(), path, "exec")
        exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = status or 1
    _EXIT(status)


def main() -> None:
    mode, fd = sys.argv[1], int(sys.argv[2])
    with open(".leakray_token", "rb") as fh:
        token = fh.read().strip()
    os.unlink(".leakray_token")
    judge(mode, token, fd)


def judge(mode: str, token: bytes, fd: int) -> None:
    """Run MODE in this process and report on fd; never returns."""
    del sys.argv[1:]  # the program sees a plain argv
    sys.path[0] = os.getcwd()  # the work dir, not leakray's package dir, is the import root
    sys.stdin = open(os.devnull)
    report = _reporter(token, fd)
    del token
    try:
        MODES[mode](report)
    except SyntaxError:
        traceback.print_exc()
        report("error")
    except MemoryError:
        sys.stderr.write("MemoryError\n")
        report("memory")
    except BaseException:  # SystemExit included: exiting is not passing
        try:
            traceback.print_exc()
        except BaseException:
            pass
        report("failed")
    report("failed")  # unreachable unless a mode returned without reporting


if __name__ == "__main__":
    main()
