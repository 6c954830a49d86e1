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
    box = Sandbox(SandboxConfig(timeout_s=5, memory_mb=512, max_output_bytes=1 << 20, warm=request.param))
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
    try:
        with open(p, 'rb') as fh:
            found.update(re.findall(rb'[0-9a-f]{32}', fh.read(1 << 20)))
    except OSError:
        pass
for tok in found:
    for fd in range(3, 64):
        try: os.write(fd, b'LEAKRAY ' + tok + b' passed\n')
        except OSError: pass
os._exit(0)
'''
    assert_not_passed(run(sb, prog, WRONG_TESTS))


def test_patching_os_write_does_not_pass(sb):
    prog = GOOD + ("import os, posix\n_w = os.write\n"
                   "def w(fd, data):\n    return _w(fd, data.replace(b'failed', b'passed'))\n"
                   "os.write = w\nposix.write = w\n")
    assert_not_passed(run(sb, prog, WRONG_TESTS))


def test_patching_harness_globals_does_not_pass(sb):
    prog = GOOD + ("import __main__, sys\n"
                   "for mod in (__main__, sys.modules.get('__main__')):\n"
                   "    for name in dir(mod):\n"
                   "        if name.startswith('run_'):\n"
                   "            setattr(mod, name, lambda report: report('passed'))\n"
                   "    if hasattr(mod, 'MODES'):\n"
                   "        mod.MODES.update({k: (lambda report: report('passed')) for k in mod.MODES})\n")
    assert_not_passed(run(sb, prog, WRONG_TESTS))


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
    res = run(sb, "import sys\ndata = sys.stdin.read()\nx = input()\n", "pass\n", timeout_s=3)
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
    prog = ("import socket\nreached = []\n"
            "for addr in [('1.1.1.1', 53), ('8.8.8.8', 53), ('pypi.org', 443)]:\n"
            "    try:\n        socket.create_connection(addr, timeout=1).close(); reached.append(addr)\n"
            "    except OSError:\n        pass\n")
    assert run(bwrap, prog, "assert reached == [], reached\n")[X.STATUS] == "passed"


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
            {X.ID: "b", X.LANGUAGE: "python", X.PROGRAM: probe, X.TESTS: "assert MINE == [] and FILES == [], (MINE, FILES)\n"}]
    first, second = bwrap.run_many(reqs, workers=1)
    assert first[X.STATUS] == "passed", first
    assert second[X.STATUS] == "passed", second


def test_setuid_binaries_gain_nothing(bwrap):
    prog = ("import subprocess, shutil\nGOT = []\n"
            "for cmd in (['sudo', '-n', 'id', '-u'], ['su', '-c', 'id -u'], ['newgrp']):\n"
            "    if shutil.which(cmd[0]):\n"
            "        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3)\n"
            "        if r.returncode == 0 and r.stdout.strip() == '0':\n"
            "            GOT.append(cmd[0])\n")
    assert run(bwrap, prog, "assert GOT == [], GOT\n")[X.STATUS] == "passed"
