"""`Sandbox.run(request) -> result`: one untrusted program, its tests, and a verdict.

Each run gets a fresh process tree under `isolation`, a random token the harness must echo
on a private fd to claim a pass (exactly one line, nothing else: `read_verdict`), and a
wall-clock timer that kills the whole tree."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from leakray.sandbox import isolation as iso
from leakray.sandbox import java as J
from leakray.sandbox import javac_warm
from leakray.sandbox import runners as R
from leakray.sandbox import warm
from leakray.errors import BadInput
from leakray.sandbox.config import SandboxConfig
from leakray.schema import LANGUAGES, X

_MEMORY_HINTS = re.compile(rb"MemoryError|OutOfMemoryError|Cannot allocate memory|bad_alloc|"
                           rb"Could not reserve enough space|insufficient memory")
_RUNNER_LANGUAGES = {"python": ("python",), "unittest": ("python",), "pytest": ("python",),
                     "stdio": ("python",), "java-main": ("java",), "junit5": ("java",)}


def _tail(data: bytes, n: int) -> str:
    return data[-n:].decode("utf-8", errors="replace")


def _result(rid, status: str, duration: float = 0.0, stdout: str = "", stderr: str = "") -> dict:
    return {X.ID: rid, X.STATUS: status, X.PASSED: status == "passed", X.DURATION_S: round(duration, 4),
            X.STDOUT_TAIL: stdout, X.STDERR_TAIL: stderr}


def error_result(rid, message: str, harness_error: str | None = None) -> dict:
    """`harness_error` marks a result the sandbox failed to produce (`X.HARNESS_ERROR`): callers
    may retry it or set the row aside, which they must never do for the program's own error."""
    result = _result(rid, "error", stderr=message)
    if harness_error:
        result[X.HARNESS_ERROR] = harness_error
    return result


class Sandbox:
    """Runs requests (dicts keyed by `leakray.schema.X`) in isolated processes; thread-safe."""

    def __init__(self, config: SandboxConfig | dict | None = None):
        if isinstance(config, dict):
            config = SandboxConfig.from_dict(config)
        self.config = config or SandboxConfig()
        # the level every report records (`Sandbox.isolation`): "bwrap", or an opted-in weaker one
        self.isolation = iso.detect(self.config.isolation, self.config.uid_base,
                                    quiet=not self.config.allow_weak_isolation)
        if self.isolation != iso.BWRAP and not self.config.allow_weak_isolation:
            raise BadInput(f"bubblewrap is unavailable here (isolation would be '{self.isolation}': programs would see "
                           "the host filesystem); install it (apt-get install bubblewrap) or opt in with "
                           "execute.allow_weak_isolation: true", field="execute.allow_weak_isolation")
        self._uids = iso.UidPool(self.config.uid_base) if os.geteuid() == 0 else None
        if self._uids and self.isolation != iso.BWRAP and not iso.uid_can_run(self.config.python, self.config.uid_base):
            iso.warn_once("root", f"leakray sandbox: uid {self.config.uid_base} cannot run {self.config.python} "
                                  "(no bubblewrap to show it a hidden install); programs run AS ROOT")
            self._uids = None
        # the interpreter may live under a hidden directory (pyenv in /root): show it again, read-only
        java = [os.path.join(self.config.java_home, "bin", "java")] if self.config.java_home else []
        self._exposed = iso.exposed_paths([self.config.python] + java, [os.path.dirname(os.path.abspath(__file__))])
        self._zygotes = None
        # warm javacs, one pool per set of bound paths (the JUnit jars a compile needs on its class path)
        self._javacs: dict[tuple, warm.ZygotePool | object] | None = None
        if self.config.warm and self.isolation == iso.BWRAP and self._uids is not None:
            self._zygotes = warm.ZygotePool(self._new_zygote)
            self._javacs = {}
            weakref.finalize(self, _close_pools, self._zygotes, self._javacs)

    def _new_zygote(self) -> warm.Zygote:
        uid, lock = self._uids.acquire()
        return warm.Zygote(self.config.python, uid, lock, self.config.work_dir_mb * 2, self._exposed)

    def _new_javac(self, ro_binds: tuple) -> javac_warm.JavacServer:
        cfg = self.config
        uid, lock = self._uids.acquire()  # the server releases it when it closes, or fails to start
        return javac_warm.JavacServer(R.java_bin(cfg, "java"), R.jvm_flags(cfg), uid, lock, cfg.work_dir_mb,
                                      cfg.java_memory_mb, cfg.max_procs, self._exposed + list(ro_binds))

    def close(self) -> None:
        """Stop the warm workers (also done when the Sandbox is garbage-collected or the host exits)."""
        if self._zygotes:
            _close_pools(self._zygotes, self._javacs)

    # ---- public API -------------------------------------------------------------------------
    def run(self, request: dict) -> dict:
        rid = request.get(X.ID) if isinstance(request, dict) else None
        try:
            rid, runner, program, tests, timeout = self._validate(request)
        except R.RunnerError as exc:
            return error_result(rid, f"bad request: {exc}", harness_error="BadRequest")
        start = time.monotonic()
        try:
            if runner == "stdio":
                result = self._run_stdio(rid, program, tests, timeout)
            elif runner in ("java-main", "junit5"):
                result = self._run_plan(rid, R.java_plan(runner, program, tests, self.config, timeout))
            else:
                result = self._run_plan(rid, R.python_plan(runner, program, tests, self.config, timeout))
        except R.RunnerError as exc:
            return error_result(rid, str(exc))
        except Exception as exc:  # the harness's own failure: one `error`, never a stopped batch
            return error_result(rid, f"leakray sandbox: {type(exc).__name__}: {exc}", harness_error=type(exc).__name__)
        result[X.DURATION_S] = round(time.monotonic() - start, 4)
        return result

    def run_many(self, requests: list[dict], workers: int = 2) -> list[dict]:
        """Results in input order; each run is its own process tree, so threads suffice."""
        if workers <= 1 or len(requests) <= 1:
            return [self.run(r) for r in requests]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(self.run, requests))

    # ---- internals --------------------------------------------------------------------------
    def _validate(self, req) -> tuple:
        if not isinstance(req, dict):
            raise R.RunnerError("a request must be a JSON object")
        rid = req.get(X.ID)
        if not isinstance(rid, str) or not rid:
            raise R.RunnerError(f"field '{X.ID}' must be a non-empty string")
        language = req.get(X.LANGUAGE)
        if language not in LANGUAGES:
            raise R.RunnerError(f"field '{X.LANGUAGE}' must be one of {LANGUAGES}, got {language!r}")
        runner = req.get(X.RUNNER) or X.DEFAULT_RUNNER[language]
        if runner not in X.RUNNERS:
            raise R.RunnerError(f"field '{X.RUNNER}' must be one of {X.RUNNERS}, got {runner!r}")
        if language not in _RUNNER_LANGUAGES[runner]:
            raise R.RunnerError(f"runner {runner!r} does not run {language}")
        for name in (X.PROGRAM, X.TESTS):
            if not isinstance(req.get(name), str):
                raise R.RunnerError(f"field '{name}' must be a string")
        if "\x00" in req[X.PROGRAM] + req[X.TESTS]:
            raise R.RunnerError("NUL byte in program or tests")
        timeout = req.get(X.TIMEOUT_S)
        if timeout is None:
            timeout = self.config.timeout_s
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
            raise R.RunnerError(f"field '{X.TIMEOUT_S}' must be a number in (0, 3600], got {timeout!r}")
        return rid, runner, req[X.PROGRAM], req[X.TESTS], float(timeout)

    def _run_plan(self, rid, plan: R.Plan) -> dict:
        if plan.javac_args is not None and self._javacs is not None:
            compiled = self._compile_warm(rid, plan)
            if isinstance(compiled, dict):
                return compiled  # javac refused the sources, or did not finish: the run's result
            plan = compiled or plan  # None: no warm javac answered, the plan compiles cold
        token = secrets.token_hex(16)
        raw = self._exec_warm(plan, token) if self._zygotes and plan.mode else None
        if raw is None:
            raw = self._exec(dict(plan.files, **{".leakray_token": token}), plan.argv, plan.memory_mb,
                             plan.wall_s, ro_binds=plan.ro_binds)
        verdict, junk = read_verdict(raw["channel"], token)
        if junk:
            status = "error"
        elif verdict is not None:
            status = verdict
        elif raw["timed_out"]:
            status = "timeout"
        elif raw["rc"] == R.COMPILE_ERROR_RC and plan.argv[0] == "/bin/sh":
            status = "error"
        elif raw["rc"] in R.RUN_TIMEOUT_RCS and plan.argv[0] == "/bin/sh":
            status = "timeout"
        elif _MEMORY_HINTS.search(raw["stderr"][-65536:]):
            status = "memory"
        else:
            status = "failed"  # died without the harness's word: an exit, a signal, a killed parent
        n = self.config.tail_bytes
        stderr = _tail(raw["stderr"], n)
        if junk:
            stderr += f"\n[leakray] {junk}"
        elif verdict is None and status == "failed":  # say why, or an exit(0) looks like a silent failure
            stderr += f"\n[leakray] the run ended (exit status {raw['rc']}) before the tests reported"
        return _result(rid, status, raw["duration"], _tail(raw["stdout"], n), stderr[-n:])

    def _compile_warm(self, rid, plan: R.Plan) -> R.Plan | dict | None:
        """The plan's sources compiled by a warm javac: the plan that runs the classes, a result
        (`error` with javac's diagnostics, as a cold javac's refusal gives; `timeout` past the
        compile grace), or None when no warm javac could answer (then the plan compiles cold)."""
        key = tuple(plan.ro_binds)
        pool = self._javacs.get(key)
        if pool is None:
            pool = self._javacs.setdefault(key, warm.ZygotePool(functools.partial(self._new_javac, key)))
        if pool is _COLD:
            return None
        try:
            server = pool.borrow()
        except RuntimeError:  # it did not start (a JDK without its compiler module, a JVM refusing the
            self._javacs[key] = _COLD  # limits): every run compiles cold rather than trying again
            pool.close()
            return None
        # in the cold javac's order (sorted), so its diagnostics come in the same order
        sources = {name: plan.files[name] for name in sorted(plan.files) if name.endswith(".java")}
        start = time.monotonic()
        try:
            got = server.compile(plan.javac_args, sources, timeout=self.config.compile_grace_s)
        except javac_warm.CompileTimeout:
            return _result(rid, "timeout", time.monotonic() - start,
                           stderr=f"[leakray] javac did not finish within {self.config.compile_grace_s:g} s")
        if got is None:
            return None
        if server.alive():
            pool.give_back(server)
        else:
            server.close()  # retired after its last compile: its process reaped, its uid freed
        rc, said, classes = got
        if rc != 0:
            return _result(rid, "error", time.monotonic() - start, stderr=_tail(said.encode(), self.config.tail_bytes))
        harness = set(J.HARNESS_CLASSES)
        files: dict[str, str | bytes] = dict(plan.files)
        files.update({(".h/" if name in harness else "classes/") + name: data for name, data in classes.items()})
        return dataclasses.replace(plan, files=files, argv=plan.warm_argv, javac_args=None)

    def _exec_warm(self, plan: R.Plan, token: str, stdin: str | None = None) -> dict | None:
        """Fork the run from a warm interpreter; None when no zygote could answer (then run cold)."""
        cfg = self.config
        z = self._zygotes.borrow()
        request = {"mode": plan.mode, "files": plan.files, "uid": z.uid,
                   "memory_mb": plan.memory_mb, "cpu_s": plan.wall_s, "wall_s": plan.wall_s,
                   "max_procs": cfg.max_procs, "fsize": cfg.max_output_bytes, "stdin": stdin,
                   # stdio is judged on the whole stdout, the others on its tail
                   "tail": cfg.max_output_bytes if plan.mode == "stdio" else cfg.tail_bytes,
                   "env": iso.sandbox_env()}
        res = z.call(request, timeout=plan.wall_s + 30, token=token)
        if res is None:
            return None
        self._zygotes.give_back(z)
        if res.get("fault"):
            raise RuntimeError(res["stderr"])
        return {"rc": res["rc"], "timed_out": res["timed_out"], "duration": res["duration"],
                "stdout": res["stdout"].encode("latin-1"), "stderr": res["stderr"].encode("latin-1"),
                "channel": res["channel"].encode("latin-1")}

    def _run_stdio(self, rid, program: str, tests: str, timeout: float) -> dict:
        cases = R.stdio_cases(tests)
        n, last = self.config.tail_bytes, None
        plan = R.Plan({"solution.py": program}, [], self.config.memory_mb, timeout, mode="stdio")
        for k, (stdin, expected) in enumerate(cases):
            raw = self._exec_warm(plan, "", stdin=stdin) if self._zygotes else None
            if raw is None:
                raw = self._exec({"solution.py": program}, [self.config.python, "-I", "solution.py"],
                                 self.config.memory_mb, timeout, stdin=stdin.encode())
            last = raw
            got = raw["stdout"].decode("utf-8", errors="replace")
            if raw["timed_out"]:
                status = "timeout"
            elif raw["rc"] != 0:
                status = "memory" if _MEMORY_HINTS.search(raw["stderr"][-65536:]) else "failed"
            elif not R.outputs_match(got, expected):
                status = "failed"
            else:
                continue
            return _result(rid, status, 0.0, _tail(raw["stdout"], n),
                           f"case {k} of {len(cases)}: {status}\n" + _tail(raw["stderr"], n))
        # every case's output was compared by us, outside the sandbox: that is the proof
        return _result(rid, "passed", 0.0, _tail(last["stdout"], n), _tail(last["stderr"], n))

    def _exec(self, files: dict[str, str | bytes], argv: list[str], memory_mb: int, wall_s: float, *,
              stdin: bytes | None = None, ro_binds=()) -> dict:
        cfg = self.config
        uid, uid_lock = self._uids.acquire() if self._uids else (None, None)
        opened: list = []
        work = None
        try:
            channel = tempfile.TemporaryFile()
            os.fchmod(channel.fileno(), 0o666)  # Java reopens it as /proc/self/fd/N under the run's uid
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            opened += [channel, out, err]
            stdin_f = subprocess.DEVNULL
            if stdin is not None:
                stdin_f = tempfile.TemporaryFile()
                opened.append(stdin_f)
                stdin_f.write(stdin)
                stdin_f.seek(0)
            argv = [a.replace("{fd}", str(channel.fileno())) for a in argv]
            env = iso.sandbox_env()
            pass_fds = [channel.fileno()]
            if self.isolation == iso.BWRAP:
                fds = {}
                for name, text in files.items():
                    fd = os.memfd_create("leakray", 0)
                    opened.append(fd)
                    os.write(fd, text if isinstance(text, bytes) else text.encode("utf-8"))
                    os.lseek(fd, 0, os.SEEK_SET)
                    fds[name] = fd
                pass_fds += list(fds.values())
                full = iso.bwrap_argv(files=fds, work_dir_mb=cfg.work_dir_mb, env=env,
                                      ro_binds=self._exposed + list(ro_binds)) + iso.drop_prefix(uid, cfg.max_procs) + argv
                cwd = "/"
            else:
                work = tempfile.mkdtemp(prefix="leakray-run-")
                for name, text in files.items():
                    with open(os.path.join(work, name), "wb") as fh:
                        fh.write(text if isinstance(text, bytes) else text.encode("utf-8"))
                if uid is not None:
                    for path in [work] + [os.path.join(work, f) for f in files]:
                        os.chown(path, uid, uid)
                env = iso.sandbox_env(home=work)
                full = (iso._unshare_prefix() + iso.drop_prefix(uid) if self.isolation == iso.UNSHARE else []) + argv
                cwd = work
            start = time.monotonic()
            proc = subprocess.Popen(
                full, stdin=stdin_f, stdout=out, stderr=err, cwd=cwd, env=env, pass_fds=pass_fds,
                preexec_fn=iso.preexec(uid=uid, memory_mb=memory_mb, cpu_s=wall_s,
                                       max_procs=cfg.max_procs, max_file_bytes=cfg.max_output_bytes,
                                       drop=self.isolation == iso.NONE))
            timed_out = threading.Event()

            def kill():
                timed_out.set()
                _killpg(proc.pid)
            timer = threading.Timer(wall_s, kill)
            timer.daemon = True
            timer.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                timer.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            duration = time.monotonic() - start
            _killpg(proc.pid)  # stragglers that kept the group (fallback modes)
            if uid is not None and self.isolation != iso.BWRAP:
                _kill_uid(uid)  # stragglers that left the group: everything the run's uid owns
            cpu = usage.ru_utime + usage.ru_stime
            rc = proc.returncode
            cpu_killed = rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (
                rc in (-signal.SIGKILL, 128 + signal.SIGKILL) and cpu >= int(wall_s) + 1)
            return {"rc": rc, "timed_out": timed_out.is_set() or cpu_killed, "duration": duration,
                    "stdout": _read(out, cfg.max_output_bytes), "stderr": _read(err, cfg.max_output_bytes),
                    "channel": _read(channel, 1 << 16)}
        finally:
            for f in opened:
                if isinstance(f, int):
                    os.close(f)
                else:
                    f.close()
            if work:
                shutil.rmtree(work, ignore_errors=True)
            if uid_lock is not None:
                iso.UidPool.release(uid_lock)


_COLD = object()  # a `_javacs` entry: no warm javac could start for these binds


def _close_pools(zygotes: warm.ZygotePool, javacs: dict) -> None:
    zygotes.close()
    for pool in list(javacs.values()):
        if pool is not _COLD:
            pool.close()


def read_verdict(channel: bytes, token: str) -> tuple[str | None, str | None]:
    """(status, None) for exactly one well-formed line `LEAKRAY <token> <status>\\n`; (None, None) for an
    empty channel (the harness never reported); (None, why) for anything else: a second line, a
    wrong token or any other byte means something other than the harness wrote there."""
    if not channel:
        return None, None
    lines = channel.split(b"\n")
    if len(lines) != 2 or lines[1]:
        count = len(lines) - 1 if not lines[-1] else "an unterminated"
        return None, f"the result channel held {count} line(s), not one verdict"
    parts = lines[0].split(b" ")
    if (len(parts) != 3 or parts[0] != b"LEAKRAY" or not secrets.compare_digest(parts[1], token.encode())
            or parts[2].decode("ascii", "replace") not in X.STATUSES):
        return None, "the result channel held a line that is not this run's verdict"
    return parts[2].decode("ascii"), None


def _read(f, limit: int) -> bytes:
    f.seek(0)
    return f.read(limit)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """kill(-1) as the run's uid reaches exactly the processes that uid owns."""
    # zygote_py._kill_uid is its twin on purpose: that file runs inside the sandbox on the
    # stdlib alone (`python -I`), so it cannot import this module.
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
