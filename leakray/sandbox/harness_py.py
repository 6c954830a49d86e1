"""Runs inside the sandbox (stdlib + the test framework only): `python -I harness_py.py MODE RESULT_FD`.

A pass is the single line `LEAKRAY <token> passed` on RESULT_FD, written only after the tests ran
to the end; the host accepts exactly one line and nothing else on that channel. The token is
read from a file deleted before any untrusted code runs, and never printed: printing, reading
files, exiting early (`exit()`, `sys.exit`, `os._exit`), atexit hooks (we leave with `_exit`) never
pass.

- `python` (HumanEval, MBPP): program and tests never share a process (`split_py`): the worker
  that runs the program is forked before the token exists and has no channel; this process, the
  judge, runs only the tests and is non-dumpable.
- `unittest` (ClassEval), `pytest` (NaturalCodeBench): the tests construct program objects, so
  they share the program's interpreter. `guard_py` locks it down before any untrusted code (no
  frames, gc, ctypes, /proc, tracing, signal handlers for the program; frozen framework classes);
  the harness keeps what it needs after the program ran in locals captured beforehand, leaves
  `sys.modules`, checks the framework's module bindings after the program's top level, and counts
  a test as passed only when its own wrapper saw the test function return.
"""

import os
import sys
import traceback

from posix import _exit as _EXIT  # bound before untrusted code can patch `os`
from posix import write as _WRITE

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # `-I` leaves the script's dir out
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import split_py  # noqa: E402  (next to this file; guard_py is imported by `judge`, who needs it)

MODULE = "solution"
PROGRAM_FILE, TESTS_FILE = "solution.py", "tests.py"
PYTEST_FILE = "test_solution.py"  # NCB: program and tests in one module, as pytest collects it


def _reporter(token: bytes, fd: int, kill_all=None):
    """`kill_all`: (kill, -1, SIGKILL) where the run has a uid of its own (warm path): every other
    process of the run dies before the verdict, so the zygote rarely needs a fork to do it."""
    def report(status: str, _w=_WRITE, _x=_EXIT, _t=token, _fd=fd, _out=sys.stdout, _err=sys.stderr,
               _k=kill_all) -> None:
        for stream in (_out, _err):  # the streams as the harness set them: a replacement is never called
            try:
                stream.flush()
            except BaseException:
                pass
        if _k:
            try:
                _k[0](_k[1], _k[2])
            except BaseException:
                pass
        try:
            _w(_fd, b"LEAKRAY " + _t + b" " + status.encode() + b"\n")
        finally:
            _x(0)
    return report


def _compile(path: str):
    with open(path, encoding="utf-8") as fh:
        return compile(fh.read(), os.path.abspath(path), "exec")  # SyntaxError: the harness's `error`


def _module(name: str, path: str):
    import types

    module = types.ModuleType(name)
    module.__file__ = os.path.abspath(path)
    sys.modules[name] = module  # dataclasses, pickle and unittest look modules up by name
    return module


# ---- python: program in a worker process, tests here --------------------------------------------

def spawn_worker(close: tuple = ()) -> tuple:
    """Fork the program's worker now, before the token is read; (judge's link fds, worker pid)."""
    worker_rd, judge_wr = os.pipe()  # requests
    judge_rd, worker_wr = os.pipe()  # replies
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (*close, judge_wr, judge_rd):
                os.close(fd)
            split_py.worker_main(worker_rd, worker_wr)
        finally:
            _EXIT(70)
    os.close(worker_rd)
    os.close(worker_wr)
    return (judge_rd, judge_wr), pid


def judge_split(token: bytes, fd: int, link_fds: tuple, kill_all=None) -> None:
    """The judge of the `python` runner; never returns. The token must not be in the worker's memory."""
    import ctypes

    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE: the worker may not read us
        _EXIT(70)
    report = _reporter(token, fd, kill_all)
    del token
    sys.stdin = open(os.devnull)
    del sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if p != here]  # the tests import installed modules only
    try:
        tests = _compile(TESTS_FILE)  # before the program runs: it may rewrite the file
    except SyntaxError:
        traceback.print_exc()
        report("error")
    link = split_py.Link(*link_fds)
    status = "failed"
    try:
        names = split_py.program_globals(link, PROGRAM_FILE, MODULE)
        namespace = {"__name__": MODULE + "_tests", "__builtins__": __builtins__, **names}
        exec(tests, namespace)
        status = "passed"
    except SyntaxError:
        traceback.print_exc()
        status = "error"
    except MemoryError:
        sys.stderr.write("MemoryError\n")
        status = "memory"
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
    report(status)


# ---- unittest / pytest: in one guarded interpreter ----------------------------------------------

def _bindings(modules) -> dict:
    """What the framework's code looks up by name: every callable a module binds (identity)."""
    return {(m.__name__, k): v for m in modules for k, v in list(vars(m).items())
            if callable(v) and not isinstance(v, type(sys))}


def _framework_modules(prefixes):
    import builtins

    return [builtins] + [m for n, m in list(sys.modules.items()) if m is not None and n.split(".")[0] in prefixes]


def run_unittest(report) -> None:
    import unittest

    # everything used after the program ran is bound here, before: not looked up by name later
    len_, id_, type_, getattr_, vars_, sorted_, isinstance_ = len, id, type, getattr, vars, sorted, isinstance
    bindings, write, stderr = _bindings, sys.stderr.write, sys.stderr
    TestCase, Suite, Runner = unittest.TestCase, unittest.TestSuite, unittest.TextTestRunner
    loader = unittest.TestLoader()
    modules = _framework_modules(("unittest", "contextlib"))
    before = _bindings(modules)
    frame_names = [n for n, v in vars_(TestCase).items() if type(v) is type(_compile) and not n.startswith("__")]
    program, tests = _compile(PROGRAM_FILE), _compile(TESTS_FILE)
    module = _module(MODULE, PROGRAM_FILE)
    exec(program, module.__dict__)
    now = bindings(modules)
    changed = sorted_(f"{m}.{k}" for (m, k), v in now.items() if before.get((m, k)) is not v)
    changed += sorted_(f"{m}.{k}" for (m, k) in before if (m, k) not in now)
    if changed:
        write(f"[leakray] the program rebound the test framework: {', '.join(changed[:5])}\n")
        report("failed")
    exec(tests, module.__dict__)
    suite = loader.loadTestsFromModule(module)
    ran: dict = {}
    cases = []

    def flatten(s):
        for t in s:
            if isinstance_(t, Suite):
                flatten(t)
            else:
                cases.append(t)
    flatten(suite)
    for case in cases:
        d = vars_(case)
        cls = type_(case)
        for name in frame_names:  # the framework's own methods, whatever the class says later
            if getattr_(cls, name, None) is getattr_(TestCase, name):
                d[name] = getattr_(TestCase, name).__get__(case)
        method = getattr_(case, case._testMethodName)

        def wrapper(_m=method, _key=id_(case)):
            _m()
            ran[_key] = True  # reached only when the test body returned
        d[case._testMethodName] = wrapper
    result = Runner(stream=stderr, verbosity=1).run(suite)
    ok = (len_(cases) > 0 and len_(ran) == len_(cases) and result.testsRun == len_(cases)
          and not result.failures and not result.errors and not result.skipped
          and not result.unexpectedSuccesses and not result.expectedFailures)
    if len_(ran) != len_(cases) and not result.failures and not result.errors:
        write(f"[leakray] {len_(cases) - len_(ran)} of {len_(cases)} tests did not return normally\n")
    report("passed" if ok else "failed")


def run_pytest(report) -> None:
    import pytest

    # everything used after the program ran is bound here, before: not looked up by name later
    len_, id_, callable_, getattr_, sorted_, int_ = len, id, callable, getattr, sorted, int
    bindings, write, main = _bindings, sys.stderr.write, pytest.main
    compile(open(PYTEST_FILE, encoding="utf-8").read(), PYTEST_FILE, "exec")  # a SyntaxError is an `error`
    modules = _framework_modules(("_pytest", "pytest", "pluggy", "contextlib"))
    before = _bindings(modules)
    ran: dict = {}
    wrapped: list = []
    counts = {"failed": 0, "passed": 0, "rebound": []}

    def modifyitems(session, config, items):  # after collection ran the program's top level
        now = bindings(modules)
        counts["rebound"] = sorted_(f"{m}.{k}" for (m, k), v in before.items() if now.get((m, k)) is not v)
        for item in items:
            fn = getattr_(item, "obj", None)
            if fn is None or not callable_(fn):
                continue

            def wrapper(*a, _f=fn, _key=id_(item), **k):
                out = _f(*a, **k)
                ran[_key] = True  # reached only when the test function returned
                return out
            item.obj = wrapper
            wrapped.append(item)

    def logreport(report):
        if report.failed:
            counts["failed"] += 1
        elif report.passed and report.when == "call":
            counts["passed"] += 1

    def collectreport(report):
        if report.failed:
            counts["failed"] += 1

    plugin = type(sys)("leakray_tally")  # a module as plugin: no class for the program to find and patch
    plugin.pytest_collection_modifyitems = pytest.hookimpl(trylast=True)(modifyitems)
    plugin.pytest_runtest_logreport = logreport
    plugin.pytest_collectreport = collectreport
    # no:debugging: its pytestPDB keeps the running config where the program could reach it
    code = main(["-q", "-p", "no:cacheprovider", "-p", "no:pastebin", "-p", "no:debugging",
                 "--rootdir", os.getcwd(), "-c", os.devnull, PYTEST_FILE], plugins=[plugin])
    if counts["rebound"]:
        write(f"[leakray] the program rebound the test framework: {', '.join(counts['rebound'][:5])}\n")
    ok = (int_(code) == 0 and counts["passed"] > 0 and counts["failed"] == 0 and not counts["rebound"]
          and len_(wrapped) > 0 and len_(ran) == len_(wrapped))
    if int_(code) == 0 and len_(ran) != len_(wrapped):
        write(f"[leakray] {len_(wrapped) - len_(ran)} of {len_(wrapped)} tests did not return normally\n")
    report("passed" if ok else "failed")


MODES = {"unittest": run_unittest, "pytest": run_pytest}
# Classes made immutable before the program runs: what decides pass or fail. Not all of pytest:
# it patches some of its own classes while configuring (legacypath's Cache.makedir).
FROZEN = {"unittest": ("unittest.*", "contextlib"),
          "pytest": ("contextlib", "_pytest.python_api", "_pytest.raises", "_pytest.approx", "_pytest.outcomes",
                     "_pytest.reports", "_pytest.runner", "pluggy.*")}


def judge(mode: str, secret: dict, fd: int, kill_all=None) -> None:
    """Run an in-process MODE here and report on fd; never returns. `secret` holds the token under
    "token" and is emptied here, so no frame of this thread refers to it afterwards.

    The tests run on a second thread. Python runs signal handlers on the main thread only, handing
    them the frame it was in: here that is this function waiting on a lock, whose frames hold neither
    the token nor the reporter nor anything the verdict is computed from."""
    import _thread

    import guard_py  # before the work dir becomes the import root, where the program may plant files

    del sys.argv[1:]  # the program sees a plain argv
    sys.path[0] = os.getcwd()  # the work dir, not leakray's package dir, is the import root
    sys.stdin = open(os.devnull)
    token = secret.pop("token")
    box = [MODES[mode], _reporter(token if isinstance(token, bytes) else token.encode(), fd, kill_all)]
    del token
    if mode == "unittest":
        import unittest  # noqa: F401  (loaded before the freeze)
    else:
        import pytest  # noqa: F401
    guard_py.install(os.getcwd(), FROZEN[mode])
    for name in ("harness_py", "guard_py", "split_py", "zygote_py", "__main__"):
        sys.modules.pop(name, None)  # nothing of ours to patch by name
    sys.modules["__main__"] = type(sys)("__main__")
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(_run_tests, (box, done))
    while True:  # until the test thread reports (it never returns) or dies
        try:
            if done.acquire():
                break
        except BaseException:  # KeyboardInterrupt from the program (`_thread.interrupt_main`)
            continue
    _EXIT(71)  # the test thread ended without a verdict


def _run_tests(box: list, done) -> None:
    run, report = box.pop(0), box.pop(0)
    try:
        try:
            run(report)
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
    finally:
        done.release()


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


def take_token() -> bytes:
    with open(".leakray_token", "rb") as fh:
        token = fh.read().strip()
    os.unlink(".leakray_token")
    return token


def main() -> None:
    mode, fd = sys.argv[1], int(sys.argv[2])
    if mode == "python":
        link_fds, _ = spawn_worker(close=(fd,))  # while the token is still only on disk
        judge_split(take_token(), fd, link_fds)
    judge(mode, {"token": take_token()}, fd)


if __name__ == "__main__":
    main()
