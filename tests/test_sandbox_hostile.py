"""Hostile programs: every escape must fail to pass, every limit must hold, and correct
programs must still pass. Runs under bubblewrap (CI installs it); the isolation-specific cases
skip elsewhere."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from leakray.sandbox import Sandbox, SandboxConfig
from leakray.schema import X

GOOD = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
WRONG_TESTS = "assert add(2, 2) == 5\n"


@pytest.fixture(scope="module", params=[True, False], ids=["warm", "cold"])
def sb(request):
    # warm: forked from a zygote (root + bwrap); cold: a fresh interpreter in its own bwrap
    # 20 s, not the 1-5 s a quiet machine needs: a cold interpreter in its own bwrap took 5.9 s for a
    # valid program beside two end-to-end runs; the timeout tests pass their own timeout_s=1
    box = Sandbox(SandboxConfig(timeout_s=20, memory_mb=512, max_output_bytes=1 << 20, warm=request.param))
    yield box
    box.close()


@pytest.fixture(scope="module")
def bwrap(sb):
    if sb.isolation != "bwrap":
        pytest.skip("needs bubblewrap")
    return sb


def run(sb, program, tests=TESTS, runner=None, language="python", **kw):
    req = {X.ID: "t", X.LANGUAGE: language, X.PROGRAM: program, X.TESTS: tests, **kw}
    if runner:
        req[X.RUNNER] = runner
    return sb.run(req)


def assert_not_passed(res, status=None):
    assert res[X.PASSED] is False, res
    assert res[X.STATUS] != "passed", res
    if status:
        assert res[X.STATUS] == status, res


# ---- correct programs still pass ---------------------------------------------------------------

def test_correct_program_passes(sb):
    res = run(sb, GOOD)
    assert res[X.STATUS] == "passed" and res[X.PASSED] is True, res
    assert set(res) == {X.ID, X.STATUS, X.PASSED, X.DURATION_S, X.STDOUT_TAIL, X.STDERR_TAIL}


def test_wrong_program_fails(sb):
    assert_not_passed(run(sb, GOOD, WRONG_TESTS), "failed")


def test_printing_and_main_block_still_pass(sb):
    prog = GOOD + "print('hello')\nif __name__ == '__main__':\n    print(add(1, 2))\n"
    res = run(sb, prog)
    assert res[X.STATUS] == "passed", res
    assert "hello" in res[X.STDOUT_TAIL]


def test_writes_inside_work_dir_and_numpy_allowed(sb):
    prog = GOOD + ("import tempfile, numpy\nopen('scratch.txt', 'w').write('x' * 1000)\n"
                   "with tempfile.NamedTemporaryFile() as f:\n    f.write(b'y')\n"
                   "assert numpy.arange(3).sum() == 3\n")
    assert run(sb, prog)[X.STATUS] == "passed"


def test_syntax_error_is_error(sb):
    assert_not_passed(run(sb, "def add(a, b) return a + b\n"), "error")


# ---- exits and exit codes never pass ------------------------------------------------------------

@pytest.mark.parametrize("escape", [
    "exit()",
    "exit(0)",
    "quit()",
    "import sys\nsys.exit(0)",
    "raise SystemExit(0)",
    "import os\nos._exit(0)",
    "raise KeyboardInterrupt",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
])
def test_early_exit_does_not_pass(sb, escape):
    # the escape runs before the (failing) tests, as a generated program would place it
    assert_not_passed(run(sb, GOOD + escape + "\n", WRONG_TESTS))


def test_sys_exit_in_main_block_does_not_pass(sb):
    prog = GOOD + "import sys\nif __name__ == '__main__':\n    sys.exit(0)\n"
    assert_not_passed(run(sb, prog, WRONG_TESTS))


def test_exit_inside_tested_function_does_not_pass(sb):
    prog = "import sys\ndef add(a, b):\n    sys.exit(0)\n"
    assert_not_passed(run(sb, prog))


def test_atexit_hook_does_not_pass(sb):
    prog = GOOD + ("import atexit, os, sys\n"
                   "def fake():\n"
                   "    print('LEAKRAY 0 passed')\n"
                   "    for fd in range(3, 64):\n"
                   "        try: os.write(fd, b'LEAKRAY 0 passed\\n')\n"
                   "        except OSError: pass\n"
                   "    os._exit(0)\n"
                   "atexit.register(fake)\n")
    assert_not_passed(run(sb, prog, WRONG_TESTS))


def test_killing_the_parent_does_not_pass(bwrap):  # without namespaces this would kill pytest
    prog = GOOD + "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(3)\n"
    assert_not_passed(run(bwrap, prog, WRONG_TESTS))


def test_killing_every_process_does_not_pass(bwrap):
    prog = GOOD + "import os, signal\nos.kill(-1, signal.SIGKILL)\n"
    assert_not_passed(run(bwrap, prog, WRONG_TESTS))


def test_printing_the_harness_line_does_not_pass(sb):
    prog = GOOD + ("import os, sys\n"
                   "for line in ('LEAKRAY passed', 'passed', 'OK', 'LEAKRAY 00000000000000000000000000000000 passed'):\n"
                   "    print(line); print(line, file=sys.stderr)\n"
                   "    for fd in range(3, 64):\n"
                   "        try: os.write(fd, (line + '\\n').encode())\n"
                   "        except OSError: pass\n"
                   "os._exit(0)\n")
    assert_not_passed(run(sb, prog, WRONG_TESTS))


def test_reading_harness_files_does_not_pass(sb):
    # look everywhere the token could be: its file, the harness, /proc of every visible process
    prog = GOOD + r'''
import os, re, glob
found = set()
paths = ['.leakray_token', '/tmp/.leakray_token'] + glob.glob('/tmp/*') + glob.glob('/tmp/.*')
paths += glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/fd/*')
for p in paths:
    # non-blocking: a pipe or FIFO among /proc/*/fd/* would otherwise block the read until the sandbox's
    # timeout, and the program would never try the tokens it found (the test would pass vacuously)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        found.update(re.findall(rb'[0-9a-f]{32}', os.read(fd, 1 << 20)))
    except OSError:
        pass
    finally:
        os.close(fd)
for tok in found:
    for fd in range(3, 64):
        try: os.write(fd, b'LEAKRAY ' + tok + b' passed\n')
        except OSError: pass
os._exit(0)
'''
    # "failed", not a timeout: the program got through every file and tried every token it found
    assert_not_passed(run(sb, prog, WRONG_TESTS), "failed")


def test_patching_os_write_does_not_pass(sb):
    prog = GOOD + ("import os, posix\n_w = os.write\n"
                   "def w(fd, data):\n    return _w(fd, data.replace(b'failed', b'passed'))\n"
                   "os.write = w\nposix.write = w\n")
    assert_not_passed(run(sb, prog, WRONG_TESTS))


# ---- forging the verdict from inside the interpreter (issue 12) ----------------------------------
# Each attack runs with tests that fail, on every in-process and split runner, warm and cold: a
# forged pass is the only way to `passed`. FORGE is what an attacker does with anything it finds:
# call a reporter, write lines with every token-like value to every fd, leave before the tests.

FORGE = r"""
import os as _os, re as _re, sys as _sys
def _forge(objs):
    toks = set()
    def look(v, depth=0):
        try:
            look_(v, depth)
        except Exception:
            pass
    def look_(v, depth):
        if depth > 3:
            return
        if isinstance(v, (bytes, str)):
            b = v.encode() if isinstance(v, str) else v
            toks.update(_re.findall(rb'[0-9a-f]{32}', b))
        elif callable(v):
            if getattr(v, '__name__', '') in ('report', '_reporter', 'judge'):
                try:
                    v('passed')
                except BaseException:
                    pass
            for d in (getattr(v, '__defaults__', None) or ()):
                look(d, depth + 1)
            for c in (getattr(v, '__closure__', None) or ()):
                try:
                    look(c.cell_contents, depth + 1)
                except ValueError:
                    pass
        elif isinstance(v, dict):
            for x in list(v.values())[:500]:
                look(x, depth + 1)
    for o in objs:
        look(o)
    for t in toks:
        for fd in range(3, 64):
            try:
                _os.write(fd, b'LEAKRAY ' + t + b' passed\n')
            except OSError:
                pass
    if toks:
        _os._exit(0)
def _frames(f):
    out = []
    while f is not None:
        out.append(dict(f.f_locals))
        out.append(f.f_globals)
        f = f.f_back
    return out
"""

FRAME_ATTACKS = {
    "getframe": "_forge(_frames(_sys._getframe()))",
    "current_frames": "[_forge(_frames(f)) for f in _sys._current_frames().values()]",
    "traceback": "try:\n    raise ValueError\nexcept ValueError as e:\n    _forge(_frames(e.__traceback__.tb_frame))",
    "generator": "def _g():\n    yield\n_gen = _g()\n_forge(_frames(_gen.gi_frame))",
    "settrace": "_sys.settrace(lambda f, e, a: _forge(_frames(f)))\n_sys.setprofile(lambda f, e, a: _forge(_frames(f)))",
    # A timer that interrupts the run every millisecond and searches the interrupted frames. One-shot
    # and re-armed by its handler: a repeating 1-ms timer fires again before the search ends, so the
    # program never got past the first interruption (it stalled until the timeout, having searched
    # one point of the run); re-armed, the program runs on through the tests and the harness's
    # report, searched at every millisecond of it, and ends.
    "signal": ("import signal\n"
               "def _h(n, f):\n    _forge(_frames(f))\n    signal.setitimer(signal.ITIMER_REAL, 0.001)\n"
               "signal.signal(signal.SIGALRM, _h)\nsignal.setitimer(signal.ITIMER_REAL, 0.001)"),
    # the signal module's C function from a fresh copy of the builtin module (no audit event)
    "signal_fresh_module": ("import _imp, importlib.machinery\n"
                            "_sig = _imp.create_builtin(importlib.machinery.ModuleSpec('_signal', None))\n"
                            "def _h(n, f):\n    _forge(_frames(f))\n    _sig.setitimer(0, 0.001)\n"
                            "_sig.signal(14, _h)\n_sig.setitimer(0, 0.001)"),
    "audithook": "_sys.addaudithook(lambda e, a: [_forge(_frames(x)) for x in a if type(x).__name__ == 'frame'])",
    "gc": "import gc\n_forge(gc.get_objects())\n_forge([r for o in gc.get_objects() if callable(o) for r in gc.get_referrers(o)])",
    "ctypes": ("import ctypes\nctypes.pythonapi.PyEval_GetFrame.restype = ctypes.py_object\n"
               "_forge(_frames(ctypes.pythonapi.PyEval_GetFrame()))\n"
               "_forge([ctypes.string_at(id(_sys), 1 << 16)])"),
    "proc_mem": ("def _mem():\n    maps = open('/proc/self/maps').read().splitlines()\n    out = []\n"
                 "    with open('/proc/self/mem', 'rb') as m:\n        for line in maps:\n"
                 "            a, b = (int(x, 16) for x in line.split()[0].split('-'))\n"
                 "            if 'rw' in line.split()[1]:\n                try:\n"
                 "                    m.seek(a); out.append(m.read(min(b - a, 1 << 24)))\n"
                 "                except OSError:\n                    pass\n    return out\n_forge(_mem())"),
    # /proc reached without naming it: a dir fd of /, and a symlink opened through a dir fd
    "proc_mem_dirfd": ("def _mem2():\n    root = _os.open('/', _os.O_RDONLY)\n    out = []\n"
                       "    maps = _os.read(_os.open('proc/self/maps', _os.O_RDONLY, dir_fd=root), 1 << 20).decode()\n"
                       "    _os.makedirs('d', exist_ok=True)\n    try:\n        _os.symlink('/proc/self/mem', 'd/m')\n"
                       "    except FileExistsError:\n        pass\n"
                       "    m = _os.open('m', _os.O_RDONLY, dir_fd=_os.open('d', _os.O_RDONLY))\n"
                       "    for line in maps.splitlines():\n        a, b = (int(x, 16) for x in line.split()[0].split('-'))\n"
                       "        if 'rw' in line.split()[1]:\n            try:\n"
                       "                out.append(_os.pread(m, min(b - a, 1 << 24), a))\n"
                       "            except OSError:\n                pass\n    return out\n_forge(_mem2())"),
    # another process of the run's uid reads every visible process's memory for the token
    "other_process_mem": ("import subprocess\n_scan = " + repr(
        "import os, re, sys\nfound = set()\n"
        "for p in os.listdir('/proc'):\n"
        "    if not p.isdigit() or int(p) == os.getpid():\n        continue\n"
        "    try:\n        maps = open(f'/proc/{p}/maps').read().splitlines()\n"
        "        mem = open(f'/proc/{p}/mem', 'rb')\n    except OSError:\n        continue\n"
        "    for line in maps:\n        a, b = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "        if 'rw' not in line.split()[1]:\n            continue\n"
        "        try:\n            mem.seek(a)\n            found.update(re.findall(rb'[0-9a-f]{32}', mem.read(min(b - a, 1 << 24))))\n"
        "        except (OSError, ValueError, OverflowError):\n            pass\n"
        "sys.stdout.write(' '.join(t.decode() for t in found))\n") + "\n"
        "_out = subprocess.run([_sys.executable, '-c', _scan], capture_output=True, text=True).stdout\n"
        "_forge([_out])"),
    "stdout_flush": ("class _Evil:\n    def write(self, s):\n        return len(s)\n"
                     "    def flush(self):\n        _forge(_frames(_sys._getframe(1)))\n"
                     "        for fd in range(3, 64):\n            try: _os.write(fd, b'LEAKRAY passed\\n')\n"
                     "            except OSError: pass\n"
                     "_sys.stdout = _sys.stderr = _sys.__stdout__ = _sys.__stderr__ = _Evil()"),
    # the harness's own functions neutralised by name (its restore step above all), then the framework
    "harness_globals": ("for _m in list(_sys.modules.values()) + [_sys.modules.get('__main__')]:\n"
                        "    if _m is not None and ('leakray' in str(getattr(_m, '__file__', '')) or hasattr(_m, 'judge')):\n"
                        "        _forge([vars(_m)])\n"
                        "        for _k, _v in list(vars(_m).items()):\n"
                        "            if callable(_v) and not isinstance(_v, type):\n"
                        "                setattr(_m, _k, lambda *a, **k: None)\n"
                        "        if hasattr(_m, 'MODES'):\n"
                        "            _m.MODES.update({k: (lambda report: report('passed')) for k in _m.MODES})\n"
                        "import unittest\ntry:\n    unittest.TestCase.assertEqual = lambda self, *a, **k: None\n"
                        "except TypeError:\n    pass"),
}
PY_TESTS = {"python": WRONG_TESTS,
            "unittest": ("import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
                         "        self.assertEqual(add(2, 2), 5)\n"),
            "pytest": "def test_a():\n    assert add(2, 2) == 5\n"}


@pytest.mark.parametrize("runner", sorted(PY_TESTS))
@pytest.mark.parametrize("attack", sorted(FRAME_ATTACKS))
def test_forging_from_inside_does_not_pass(sb, attack, runner):
    # at the program's top level, and again from inside the tested function (after any restore)
    body = FRAME_ATTACKS[attack]
    prog = (FORGE + body + "\n" + "def add(a, b):\n    exec(compile(" + repr(FORGE + body) + ", 'x', 'exec'), {})\n"
            "    return a + b\n")
    res = run(sb, prog, PY_TESTS[runner], runner=runner, timeout_s=5)
    # the timer attacks run to the end (searched all along), not into the timeout
    assert_not_passed(res, "failed" if attack.startswith("signal") else None)


UNITTEST_PATCHES = {
    "runner_module_attr": ("import unittest\nclass _R:\n    def __init__(self, *a, **k): pass\n"
                           "    def run(self, suite):\n        r = unittest.TestResult(); r.testsRun = 1; return r\n"
                           "unittest.TextTestRunner = _R\nunittest.runner.TextTestRunner = _R"),
    "assert_class": "import unittest\nunittest.TestCase.assertEqual = lambda self, *a, **k: None",
    "assert_module_case": "import unittest.case\nunittest.case.TestCase.assertEqual = lambda self, *a, **k: None",
    "was_successful": "import unittest\nunittest.TestResult.wasSuccessful = lambda self: True",
    "add_error": "import unittest.case\nunittest.case._addError = lambda *a: None",
    "builtins": "import builtins\nbuiltins.isinstance = lambda *a: True",
    "code_swap": "import unittest\nunittest.TestCase.assertEqual.__code__ = (lambda self, *a, **k: None).__code__",
    "forged_code": ("import unittest, unittest.case\nf = lambda self, *a, **k: None\n"
                    "f.__code__ = f.__code__.replace(co_filename=unittest.case.__file__)\n"
                    "unittest.TestCase.assertEqual = f"),
}
LATE_PATCH = ("import unittest, unittest.case, sys\n"
              "def add(a, b):\n"
              "    for c in unittest.TestCase.__subclasses__():\n"
              "        try: c.assertEqual = lambda self, *x, **k: None\n"
              "        except Exception: pass\n"
              "        try: setattr(c, 'test_b', lambda self: None)\n"
              "        except Exception: pass\n"
              "    try: unittest.TestCase.assertEqual = lambda self, *x, **k: None\n"
              "    except Exception: pass\n"
              "    unittest.case._addError = lambda *x: None\n"
              "    raise unittest.case._ShouldStop()\n")


@pytest.mark.parametrize("patch", sorted(UNITTEST_PATCHES))
def test_patching_unittest_at_top_level_does_not_pass(sb, patch):
    prog = GOOD + UNITTEST_PATCHES[patch] + "\n"
    assert_not_passed(run(sb, prog, PY_TESTS["unittest"], runner="unittest"))


def test_patching_unittest_during_the_tests_does_not_pass(sb):
    # after the harness's checks: from inside the tested function, on the test's own class, and by
    # swallowing the failure with the framework's private stop signal
    tests = ("import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
             "        add(1, 1)\n        self.assertEqual(2, 5)\n    def test_b(self):\n        self.assertEqual(1, 5)\n")
    assert_not_passed(run(sb, LATE_PATCH, tests, runner="unittest"))


PYTEST_PATCHES = {
    "hookwrapper_via_config": (
        "import pytest, _pytest.debugging\n"
        "class _P:\n    @pytest.hookimpl(hookwrapper=True)\n    def pytest_runtest_makereport(self, item, call):\n"
        "        out = yield\n        r = out.get_result(); r.outcome = 'passed'; r.longrepr = None\n"
        "cfg = getattr(_pytest.debugging.pytestPDB, '_config', None)\n"
        "if cfg is not None:\n    cfg.pluginmanager.register(_P())\n"),
    "testreport_patch": ("import _pytest.reports\n_pytest.reports.TestReport.passed = property(lambda self: True)\n"
                         "_pytest.reports.BaseReport.failed = property(lambda self: False)\n"),
    "runner_patch": ("import _pytest.runner\n_pytest.runner.call_and_report = lambda item, when, log=True, **kw: None\n"),
    "raises_from_function": "import _pytest.outcomes\ndef add(a, b):\n    raise _pytest.outcomes.Skipped('no')\n",
}


@pytest.mark.parametrize("patch", sorted(PYTEST_PATCHES))
def test_pytest_hooks_and_patches_do_not_pass(sb, patch):
    prog = GOOD + PYTEST_PATCHES[patch]
    assert_not_passed(run(sb, prog, PY_TESTS["pytest"], runner="pytest"))


def test_split_runner_program_objects_cannot_lie_about_equality(sb):
    # the classic AlwaysEqual: only plain data crosses to the judge, so it compares unequal
    prog = ("class _Eq:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
            "def add(a, b):\n    return _Eq()\n")
    assert_not_passed(run(sb, prog, WRONG_TESTS), "failed")


def test_split_runner_keeps_helpers_and_plain_values(sb):
    # HumanEval/32, /38, /50 style: the tests call program helpers; values cross as real builtins
    prog = GOOD + ("import math\nTABLE = {'a': (1, 2.5, None, b'x', {3}, frozenset({4}), 1j)}\n"
                   "def gen(n):\n    yield from range(n)\n"
                   "class Node:\n    def __init__(self, v):\n        self.v = v\n"
                   "def val(node):\n    return node.v\nroot = Node(7)\n"
                   "def boom():\n    raise ValueError('bad')\n")
    tests = ("assert TABLE == {'a': (1, 2.5, None, b'x', {3}, frozenset({4}), 1j)} and type(TABLE) is dict\n"
             "assert list(gen(3)) == [0, 1, 2]\nassert val(root) == 7 and root.v == 7\n"
             "assert math.isclose(add(0.1, 0.2), 0.3)\nassert add(a=1, b=2) == 3\n"
             "try:\n    boom()\nexcept ValueError as e:\n    assert 'bad' in str(e)\nelse:\n    raise AssertionError\n")
    res = run(sb, prog, tests)
    assert res[X.STATUS] == "passed", res


# MBPP/40, /88, /653, /902 return a Counter or defaultdict and compare it with a dict literal; /533
# passes a type. The judge rebuilds the standard library's containers and types as its own objects,
# so these compare as in one process, and `==` is still never the program's code.
STD_PROG = ("from collections import Counter, defaultdict, OrderedDict, namedtuple, deque\n"
            "def freq(lists):\n    return Counter(x for l in lists for x in l)\n"
            "def group(pairs):\n    d = defaultdict(list)\n    for k, v in pairs:\n        d[k].append(v)\n    return d\n"
            "def ordered():\n    return OrderedDict([('b', 1), ('a', 2)])\n"
            "P = namedtuple('P', 'x y')\ndef point():\n    return P(1, 2)\n"
            "def window():\n    return deque([1, 2, 3], maxlen=3)\n"
            "def remove_datatype(t, data_type):\n    return [e for e in t if not isinstance(e, data_type)]\n"
            "def kind(x):\n    return type(x)\n"
            "class Shape:\n    pass\nclass Square(Shape):\n    pass\n"
            "def make(cls):\n    return cls()\ndef is_a(x, cls):\n    return isinstance(x, cls)\n"
            "def echo(x):\n    return x\n")
STD_TESTS = ("from collections import Counter, OrderedDict, defaultdict, deque\n"
             "assert freq([[1, 2], [2, 3]]) == {1: 1, 2: 2, 3: 1}\n"
             "assert freq([[1, 2], [2, 3]]) == Counter({2: 2, 1: 1, 3: 1}) and freq([[1]])[9] == 0\n"
             "assert group([('a', 1), ('b', 2), ('a', 3)]) == {'a': [1, 3], 'b': [2]}\n"
             "assert ordered() == {'a': 2, 'b': 1} and ordered() != OrderedDict([('a', 2), ('b', 1)])\n"
             "assert point() == (1, 2) and point().y == 2\n"
             "assert window() == deque([1, 2, 3]) and window() != [1, 2, 3]\n"
             "assert remove_datatype((4, 5, 4, 7.7, 1.2), int) == [7.7, 1.2]\n"
             "assert kind(1) == int and kind('a') is str and kind(1.5) is not int\n"
             "assert is_a(make(Square), Shape) and not is_a(make(Shape), Square) and kind(make(Square)) == Square\n"
             "assert echo(Counter('aab')) == {'a': 2, 'b': 1} and echo(defaultdict(int, {1: 2})) == {1: 2}\n")


def test_split_runner_compares_stdlib_containers_and_types_as_upstream(sb):
    assert run(sb, STD_PROG, STD_TESTS)[X.STATUS] == "passed"
    for wrong in ("for x in l)", "for x in l if x != 3)"), ("d[k].append(v)", "d[k].append(v + 1)"), \
                 ("('b', 1), ('a', 2)", "('a', 2), ('b', 1)"), ("P(1, 2)", "P(2, 1)"), \
                 ("not isinstance(e, data_type)", "isinstance(e, data_type)"), ("type(x)", "x"):
        assert wrong[0] in STD_PROG
        assert_not_passed(run(sb, STD_PROG.replace(*wrong), STD_TESTS), "failed")


@pytest.mark.parametrize("liar", [
    "class _C(Counter):\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
    "def add(a, b):\n    return _C()\n",
    "class _T(tuple):\n    _fields = ('a',)\n    _make = classmethod(lambda c, it: c(it))\n"
    "    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
    "def add(a, b):\n    return _T((0,))\n",
    "class _M(type):\n    def __eq__(cls, o):\n        return True\n    __hash__ = type.__hash__\n"
    "class _K(metaclass=_M):\n    pass\ndef add(a, b):\n    return _K\n",
    "class _K:\n    def __eq__(self, o):\n        return True\n"
    "_K.__module__, _K.__qualname__ = 'builtins', 'int'\ndef add(a, b):\n    return _K()\n",
    "def add(a, b):\n    d = defaultdict(lambda: 5)\n    return d\n",
])
def test_split_runner_lookalike_containers_and_types_cannot_lie(sb, liar):
    # a subclass or a tuple posing as a namedtuple crosses as its data or as a handle; a class
    # crosses as the judge's own type or a handle; a factory only fills keys the tests ask for
    prog = "from collections import Counter, defaultdict\n" + liar
    assert_not_passed(run(sb, prog, WRONG_TESTS), "failed")
    assert_not_passed(run(sb, prog, "assert add(1, 1) == {'x': 5}\n"), "failed")


def test_channel_must_hold_exactly_one_verdict():
    from leakray.sandbox.core import read_verdict

    tok = "ab" * 16
    assert read_verdict(b"", tok) == (None, None)
    assert read_verdict(f"LEAKRAY {tok} passed\n".encode(), tok) == ("passed", None)
    for junk in (f"LEAKRAY {tok} passed\nLEAKRAY {tok} failed\n", f"LEAKRAY {tok} passed",
                 f"x\nLEAKRAY {tok} passed\n", f"LEAKRAY {'0' * 32} passed\n", f"LEAKRAY {tok} great\n"):
        status, why = read_verdict(junk.encode(), tok)
        assert status is None and why, junk


def test_closing_stdout_does_not_crash_harness(sb):
    prog = GOOD + "import sys, os\nsys.stdout.close()\nos.close(1)\n"
    assert run(sb, prog)[X.STATUS] == "passed"


# ---- limits ------------------------------------------------------------------------------------

def test_infinite_loop_times_out(sb):
    t = time.monotonic()
    res = run(sb, "while True:\n    pass\n", timeout_s=1)
    assert_not_passed(res, "timeout")
    assert time.monotonic() - t < 5


def test_sleep_times_out_on_wall_clock(sb):
    res = run(sb, "import time\ntime.sleep(60)\n", timeout_s=1)
    assert_not_passed(res, "timeout")
    assert res[X.DURATION_S] < 4


def test_ignoring_sigterm_still_killed(sb):
    prog = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n"
    assert_not_passed(run(sb, prog, timeout_s=1), "timeout")


def test_memory_bomb(sb):
    res = run(sb, "x = bytearray(4 << 30)\n")
    assert_not_passed(res, "memory")


def test_memory_bomb_growing_list(sb):
    assert_not_passed(run(sb, "x = []\nwhile True:\n    x.append(' ' * (1 << 20))\n"), "memory")


def test_fork_bomb_is_contained(bwrap):
    prog = ("import os\n"
            "for _ in range(10000):\n"
            "    try:\n        os.fork()\n    except OSError:\n        pass\n")
    t = time.monotonic()
    assert_not_passed(run(bwrap, prog, timeout_s=3))
    assert time.monotonic() - t < 10


def test_process_limit(bwrap):
    prog = ("import os\nkids = 0\n"
            "for _ in range(500):\n"
            "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        import time; time.sleep(5); os._exit(0)\n"
            "    kids += 1\n")
    res = run(bwrap, prog, "assert kids < 100, kids\n")
    assert res[X.STATUS] == "passed", res  # the fork failed long before 100


def test_huge_output_is_capped(sb):
    res = run(sb, "while True:\n    print('x' * 1000)\n", timeout_s=5)
    assert_not_passed(res)
    assert res[X.STATUS] != "timeout", res  # the file-size limit stops it, not the clock
    assert len(res[X.STDOUT_TAIL]) <= sb.config.tail_bytes


def test_huge_file_is_capped(sb):
    prog = "with open('big', 'wb') as f:\n    f.write(b'x' * (50 << 20))\n"
    assert_not_passed(run(sb, prog, "pass\n"))


def test_stdin_read_does_not_hang(sb):
    # a hang would run into the limit (status "timeout", not "failed"); 3 s was too short for a cold
    # start beside the suite's end-to-end runs on two busy cores (a fresh CI run: 3.2 s, "timeout")
    res = run(sb, "import sys\ndata = sys.stdin.read()\nx = input()\n", "pass\n", timeout_s=15)
    assert_not_passed(res, "failed")
    assert "EOFError" in res[X.STDERR_TAIL]


def test_stdin_is_empty(sb):
    prog = "import os\nDATA = os.read(0, 100)\n"
    assert run(sb, prog, "assert DATA == b''\n")[X.STATUS] == "passed"


def test_background_process_does_not_outlive_the_run(bwrap, tmp_path):
    marker = f"leakray-orphan-{os.getpid()}"
    prog = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        import sys; sys.argv[0] = '{marker}'\n        time.sleep(30)\n    os._exit(0)\n")
    assert run(bwrap, prog, "pass\n")[X.STATUS] == "passed"
    time.sleep(0.2)
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"time.sleep(30)" in fh.read():
                    alive.append(pid)
        except OSError:
            pass
    assert not alive


# ---- isolation ---------------------------------------------------------------------------------

def test_no_network_outside(bwrap):
    # proves the sandbox's own network namespace (an offline host proves nothing): the host has an
    # interface besides loopback, the sandbox sees loopback alone
    host = {name for _, name in socket.if_nameindex()}
    if host <= {"lo"}:
        pytest.skip("the host has no interface besides lo")
    prog = "import socket\nIFACES = sorted(n for _, n in socket.if_nameindex())\n"
    res = run(bwrap, prog, "assert IFACES == ['lo'], IFACES\n")
    assert res[X.STATUS] == "passed", res


def test_no_network_to_host_loopback(bwrap):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]
    hits = []
    server.settimeout(3)

    def accept():
        try:
            conn, _ = server.accept()
            hits.append(1)
            conn.close()
        except OSError:
            pass
    t = threading.Thread(target=accept)
    t.start()
    prog = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            f"    REACHED = True\nexcept OSError:\n    REACHED = False\n")
    res = run(bwrap, prog, "assert not REACHED\n")
    server.close()
    t.join()
    assert res[X.STATUS] == "passed", res
    assert not hits


def test_cannot_write_outside_work_dir(bwrap, tmp_path):
    target = tmp_path / "escaped.txt"
    prog = (f"import os\nok = []\n"
            f"for p in [{str(target)!r}, '/etc/leakray_escape', '/work/leakray_escape', '/usr/leakray_escape',\n"
            f"          {os.path.abspath(__file__)!r}]:\n"
            f"    try:\n        open(p, 'a').write('x'); ok.append(p)\n    except OSError:\n        pass\n")
    res = run(bwrap, prog, "assert ok == [], ok\n")
    assert res[X.STATUS] == "passed", res
    assert not target.exists()


def test_host_environment_is_scrubbed(bwrap, monkeypatch):
    monkeypatch.setenv("LEAKRAY_HOST_SECRET", "s3cret")
    prog = "import os\nENV = dict(os.environ)\n"
    tests = ("assert 'LEAKRAY_HOST_SECRET' not in ENV, ENV\n"
             "assert not any('s3cret' in v for v in ENV.values())\n"
             "assert set(ENV) <= {'PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_ALL', 'PYTHONDONTWRITEBYTECODE',\n"
             "    'PYTHONIOENCODING', 'PYTHONHASHSEED', 'OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS',\n"
             "    'MKL_NUM_THREADS', 'PYTEST_DISABLE_PLUGIN_AUTOLOAD', 'MPLBACKEND', 'PWD', 'LC_CTYPE'}, ENV\n")
    assert run(bwrap, prog, tests)[X.STATUS] == "passed"


def test_host_home_is_hidden(bwrap):
    home = os.path.expanduser("~")
    prog = (f"import os\nHOME = os.environ.get('HOME')\n"
            f"try:\n    LISTING = os.listdir({home!r})\nexcept OSError:\n    LISTING = []\n")
    tests = (f"assert HOME != {home!r} or {home!r} == '/tmp'\n"
             "assert not any(n in LISTING for n in ('.bashrc', '.ssh', '.profile', '.cache', '.m2')), LISTING\n")
    assert run(bwrap, prog, tests)[X.STATUS] == "passed"


def test_runs_unprivileged(bwrap):
    if os.geteuid() != 0:
        pytest.skip("only meaningful when the host runs as root")
    prog = "import os\nUID = os.getuid()\n"
    assert run(bwrap, prog, "assert UID != 0\n")[X.STATUS] == "passed"


def test_other_processes_invisible(bwrap):
    prog = "import os\nPIDS = [p for p in os.listdir('/proc') if p.isdigit()]\n"
    assert run(bwrap, prog, "assert len(PIDS) <= 4, PIDS\n")[X.STATUS] == "passed"


# ---- other runners -----------------------------------------------------------------------------

def test_unittest_runner(sb):
    tests = ("import unittest\nclass T(unittest.TestCase):\n"
             "    def test_a(self):\n        self.assertEqual(add(1, 2), 3)\n")
    assert run(sb, GOOD, tests, runner="unittest")[X.STATUS] == "passed"
    bad = tests.replace("3)", "4)")
    assert_not_passed(run(sb, GOOD, bad, runner="unittest"), "failed")
    assert_not_passed(run(sb, GOOD, "import unittest\n", runner="unittest"))  # no tests is no pass
    exiting = tests + "import sys\nsys.exit(0)\n"
    assert_not_passed(run(sb, GOOD, exiting, runner="unittest"))
    main_block = tests + "if __name__ == '__main__':\n    unittest.main()\n"
    assert run(sb, GOOD, main_block, runner="unittest")[X.STATUS] == "passed"


def test_pytest_runner_with_fixtures(sb):
    prog = "def shout(path):\n    print(open(path).read().upper())\n"
    tests = ("class TestShout:\n"
             "    @pytest.fixture\n    def note(self, tmp_path):\n"
             "        p = tmp_path / 'n.txt'\n        p.write_text('hi')\n        return p\n"
             "    def test_shout(self, note, capfd):\n"
             "        shout(note)\n        assert capfd.readouterr().out == 'HI\\n'\n")
    assert run(sb, prog, tests, runner="pytest")[X.STATUS] == "passed"
    assert_not_passed(run(sb, prog, tests.replace("'HI", "'NO"), runner="pytest"), "failed")
    assert_not_passed(run(sb, prog, "x = 1\n", runner="pytest"))  # no tests collected
    assert_not_passed(run(sb, prog + "import os\nos._exit(0)\n", tests, runner="pytest"))


def test_stdio_runner(sb):
    prog = "n = int(input())\nprint(sum(map(int, input().split())) * n)\n"
    tests = '{"inputs": ["2\\n1 2 3\\n", "1\\n5\\n"], "outputs": ["12\\n", "5"]}'
    assert run(sb, prog, tests, runner="stdio")[X.STATUS] == "passed"
    assert_not_passed(run(sb, prog.replace("* n", "+ n"), tests, runner="stdio"), "failed")
    crash = prog + "raise ValueError\n"
    assert_not_passed(run(sb, crash, tests, runner="stdio"), "failed")
    assert_not_passed(run(sb, "while True: pass\n", tests, runner="stdio", timeout_s=1), "timeout")
    main = "import sys\ndef main():\n    print(int(input()) * 3)\n    sys.exit(0)\nif __name__ == '__main__':\n    main()\n"
    assert run(sb, main, '{"inputs": ["2\\n"], "outputs": ["6\\n"]}', runner="stdio")[X.STATUS] == "passed"


def test_bad_requests_are_errors(sb):
    for req in [{}, {X.ID: "x"}, {X.ID: "x", X.LANGUAGE: "cobol", X.PROGRAM: "", X.TESTS: ""},
                {X.ID: "x", X.LANGUAGE: "python", X.PROGRAM: 1, X.TESTS: ""},
                {X.ID: "x", X.LANGUAGE: "python", X.RUNNER: "java-main", X.PROGRAM: "", X.TESTS: ""},
                {X.ID: "x", X.LANGUAGE: "python", X.PROGRAM: "", X.TESTS: "", X.TIMEOUT_S: -1}]:
        res = sb.run(req)
        assert res[X.STATUS] == "error" and res[X.PASSED] is False, (req, res)


def test_run_many_keeps_order(sb):
    reqs = [{X.ID: str(i), X.LANGUAGE: "python", X.PROGRAM: GOOD, X.TESTS: TESTS if i % 2 else WRONG_TESTS}
            for i in range(6)]
    res = sb.run_many(reqs, workers=3)
    assert [r[X.ID] for r in res] == [str(i) for i in range(6)]
    assert [r[X.PASSED] for r in res] == [bool(i % 2) for i in range(6)]


@pytest.mark.parametrize("patch", [
    "unittest.TestCase.assertEqual = lambda self, *a, **k: None",
    "unittest.TestResult.wasSuccessful = lambda self: True",
    "unittest.TestCase.run = lambda self, result=None: None",
])
def test_patching_unittest_does_not_pass(sb, patch):
    tests = ("import unittest\nclass T(unittest.TestCase):\n"
             "    def test_a(self):\n        self.assertEqual(add(1, 2), 4)\n")
    assert_not_passed(run(sb, GOOD + "import unittest\n" + patch + "\n", tests, runner="unittest"))


def test_warm_zygotes_outlive_the_threads_that_borrowed_them():
    """The stages call run_many once per batch, and its worker threads end with each call; the
    zygotes those threads borrowed must not end with them (bwrap's --die-with-parent fires when
    the *thread* that started a process ends). Three batches are served by the first's zygotes."""
    box = Sandbox(SandboxConfig(timeout_s=20))
    if box._zygotes is None:
        box.close()
        pytest.skip("the warm path needs root and bubblewrap")
    started, make = [], box._zygotes._make
    box._zygotes._make = lambda: started.append(1) or make()
    reqs = [{X.ID: str(i), X.LANGUAGE: "python", X.PROGRAM: GOOD, X.TESTS: TESTS} for i in range(6)]
    try:
        for _ in range(3):
            assert [r[X.STATUS] for r in box.run_many(reqs, workers=2)] == ["passed"] * 6
            time.sleep(0.2)  # a parent-death signal, had one been sent, has landed
            assert box._zygotes._idle and all(z.alive() for z in box._zygotes._idle)
        assert len(started) <= 2  # one per worker thread, once
    finally:
        box.close()


def test_nothing_of_one_run_survives_into_the_next(bwrap):
    # one worker, so both runs share a warm zygote when there is one
    daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              "        while True:\n            open('/tmp/planted', 'a').write('x')\n            time.sleep(0.05)\n"
              "    os._exit(0)\nopen('left_behind', 'w').write('x')\n")
    probe = ("import os, glob\n"
             "MINE = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()\n"
             "        and os.stat('/proc/' + p).st_uid == os.getuid()]\n"
             "FILES = glob.glob('/tmp/planted') + glob.glob('/tmp/*/left_behind') + glob.glob('left_behind')\n")
    reqs = [{X.ID: "a", X.LANGUAGE: "python", X.PROGRAM: daemon, X.TESTS: "pass\n"},
            # one process (stdio, judged by the host): the `python` runner's judge would count as the uid's
            {X.ID: "b", X.LANGUAGE: "python", X.RUNNER: "stdio", X.PROGRAM: probe + "print(MINE, FILES)\n",
             X.TESTS: '{"inputs": [""], "outputs": ["[] []"]}'}]
    first, second = bwrap.run_many(reqs, workers=1)
    assert first[X.STATUS] == "passed", first
    assert second[X.STATUS] == "passed", second


def test_a_forked_child_that_dies_does_not_fail_the_program(sb, tmp_path):
    """Plain Python: a child the program forked raises and ends; the parent goes on and its tests
    pass. Before the worker knew its own pid, the child came back out of the program's code into
    the worker's loop and its error reply raced the parent's: the valid program "failed" (always
    here, the child being first; under load in CI, a daemon dying on the read-only /tmp)."""
    import subprocess
    import sys

    prog = "import os, time\nif os.fork() == 0:\n    raise RuntimeError('the child dies')\ntime.sleep(0.3)\n" \
           "def f():\n    return 1\n"
    tests = "assert f() == 1\n"
    (tmp_path / "plain.py").write_text(prog + tests)
    assert subprocess.run([sys.executable, str(tmp_path / "plain.py")], capture_output=True).returncode == 0
    assert run(sb, prog, tests)[X.STATUS] == "passed"


def test_setuid_binaries_gain_nothing(bwrap):
    prog = ("import subprocess, shutil\nGOT = []\n"
            "for cmd in (['sudo', '-n', 'id', '-u'], ['su', '-c', 'id -u'], ['newgrp']):\n"
            "    if shutil.which(cmd[0]):\n"
            "        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3)\n"
            "        if r.returncode == 0 and r.stdout.strip() == '0':\n"
            "            GOT.append(cmd[0])\n")
    assert run(bwrap, prog, "assert GOT == [], GOT\n")[X.STATUS] == "passed"
