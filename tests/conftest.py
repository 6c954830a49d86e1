import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The real upstream benchmark files: shared/ beside the checkout (as CI lays it), else this workplace's copy.
SHARED_BENCHMARKS = next((p for p in (ROOT.parent / "shared" / "benchmarks", Path("/work/shared/benchmarks"))
                          if p.is_dir()), ROOT.parent / "shared" / "benchmarks")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No usage reporting from the suite's drivers: each cluster a driver runs Ray Data on otherwise
# starts a usage-collection actor (one more process importing Ray Data, ~2 CPU s) that the tests
# never read; `ray start --disable-usage-stats` reaches the head's processes, not the drivers'.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Passive OpenMP waiting, as `import leakray` sets it (leakray/__init__.py, why), here too: a test
# module imports torch before leakray (third-party imports come first), and libgomp reads the
# variable once, when torch loads it. The real head's processes inherit it from here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# javac over one big source set in a test: C1 only and the serial GC, as the sandbox runs javac
# (sandbox/runners.jvm_flags). The same wall time with half the CPU: over ~1,800 Java variants 19.4 s
# and 18.6 user s against 19.6 s and 36.5 by default (C2's compiler threads and the parallel GC kept
# the second core busy for nothing but themselves).
JAVAC_ONE_CORE = ["-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1"]


# The modules whose tests run on the real head (`ray_head`): one xdist worker runs them one after
# another, on one head for the suite, while the other workers share out the rest. Side by side on
# two heads (two end-to-end protocols, each with two CPUs of Ray workers, on a 2-core machine) they
# took 1.6-3.6x their time alone. The grouping is by module because the controller sees only node
# ids: xdist's own `xdist_group` mark does not reach them under pytest 9.2 (xdist 3.8 renames
# `item._nodeid`, which pytest no longer reads: pytest-dev/pytest-xdist#1386, open), so it is done
# here and checked below.
RAY_HEAD_MODULES = ("tests/test_e2e.py", "tests/test_faults.py", "tests/test_audit_e2e.py")


def _on_the_head(nodeid: str) -> bool:
    return nodeid.split("::", 1)[0] in RAY_HEAD_MODULES


@functools.lru_cache(maxsize=None)
def _shares_a_module_fixture(module: str) -> bool:
    """Whether a test module defines a module-scoped fixture: its tests then go to one worker as one
    unit, so the fixture is set up once. Split test by test, both workers set it up (measured over
    the 21 such modules: gpu_check's CPU run, 12 s, twice; the local Ray clusters of the Tune,
    storage and chat tests, 5-9 s, twice). Read from the file, since the controller that schedules
    sees node ids only."""
    try:
        return 'scope="module"' in (ROOT / module).read_text()
    except OSError:
        return False


@pytest.hookimpl(optionalhook=True)  # xdist's hook: `-p no:xdist` runs the suite without it
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class RayHeadFirst(LoadScopeScheduling):
        """Load scheduling, one test at a time, except the tests on the real head: one unit, the
        longest, started at once on the first worker; and a module with a module-scoped fixture,
        one unit (`_shares_a_module_fixture`)."""

        def _split_scope(self, nodeid: str) -> str:
            if _on_the_head(nodeid):
                return "ray_head"
            module = nodeid.split("::", 1)[0]
            return module if _shares_a_module_fixture(module) else nodeid

        def _assign_work_unit(self, node) -> None:
            # loadscope orders its units by their count of tests, and the head's four come after
            # every module unit of more: started late, its ~6 minutes ran on alone at the end
            if "ray_head" in self.workqueue:
                self.workqueue.move_to_end("ray_head", last=False)
            super()._assign_work_unit(node)

    return RayHeadFirst(config, log)


def pytest_collection_modifyitems(config, items):
    """A test that uses the real head outside RAY_HEAD_MODULES would run beside them on a head of
    its own: refuse the collection instead of silently slowing the suite."""
    stray = [item.nodeid for item in items
             if "ray_head" in getattr(item, "fixturenames", ()) and not _on_the_head(item.nodeid)]
    if stray:
        raise pytest.UsageError(f"tests on the real head outside RAY_HEAD_MODULES (tests/conftest.py): {stray}")


@contextlib.contextmanager
def local_ray(num_cpus: int = 2):
    """The Ray this process has, else a local one of ``num_cpus`` started here and shut down after
    (only if started here: an in-process test must not stop a cluster another test relies on)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


@pytest.fixture(autouse=True, scope="module")
def _ray_started_here_stops_here():
    """A local Ray that a module's tests started in this process (leakray's engine starts one and
    keeps it, `executor.runtime.ensure_ray`) is shut down when the module ends, not left to idle
    until the xdist worker exits: an idle local cluster with Ray Data's helper actors costs about
    8 CPU s a minute (raylet, agents, the stats and autoscaling actors, an idle worker), and the
    suite's workers kept theirs for most of the run while the machine was busy with the rest."""
    ray = sys.modules.get("ray")
    before = ray is not None and ray.is_initialized()
    yield
    ray = sys.modules.get("ray")
    if not before and ray is not None and ray.is_initialized():
        from leakray.executor.runtime import shutdown_ray

        shutdown_ray()


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A seconds-sized GPT-2 + BPE tokenizer built by the same code as the demo's base model."""
    from leakray.models.offline import TinyLMConfig, pretrain

    out = tmp_path_factory.mktemp("tiny_lm")
    # its 500 steps (the config's max_steps) took 2.5 s here: the time cap is a guard for a hung
    # build only, not a budget, so a slower machine's tests get the same model and not a shorter fit
    cfg = TinyLMConfig(vocab_size=400, n_layer=1, n_embd=32, n_head=2, n_positions=512, block_size=64,
                       batch_size=4, pretrain_seconds=60, corpus_mb=0.3, threads=1, warmup_steps=5)
    stats = pretrain(cfg, out, progress=False)
    return out, stats


@pytest.fixture(scope="session")
def leakray_cache(tmp_path_factory):
    """One LEAKRAY_CACHE for the end-to-end tests: each tiny base model is pretrained once per session."""
    return tmp_path_factory.mktemp("leakray-cache")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket stays bound until all are chosen (one at a time, the
    kernel may hand a just-closed port out again, and `ray start` refuses two components on one)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="session")
def ray_head():
    """A real head node (`ray start --head`), torn down by its own temp dir: `ray stop`
    would stop every Ray on the machine. The temp dir is short because Ray's Unix sockets
    live under it (paths are limited to ~107 bytes)."""
    # not RAY_ADDRESS: an in-process test's local Ray exports its own (executor.runtime.ensure_ray),
    # and `ray job submit` / a driver started from here would go there instead of to this head
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "disabled"}
    port, dash, agent, agent_grpc, metrics, rt_env = _free_ports(6)
    temp = tempfile.mkdtemp(prefix="lr", dir="/tmp")
    ray = str(Path(sys.executable).with_name("ray"))
    # Every port explicit: the job agent's default port clashes with any other Ray on the machine.
    # No log monitor: it streams workers' output to drivers, which leakray's drivers do not print
    # (ray.init(log_to_driver=False) unless --verbose; a job's own output reaches `ray job submit`
    # from its log file), and it globs the head's log directory ten times a second, a growing
    # share of a core as the suite's workers leave their log files (over one suite the log monitors
    # of its clusters, this head's and the in-process tests' local ones, took 63 CPU s).
    started = subprocess.run([ray, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=true",
                              "--include-log-monitor=false",
                              f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
                              f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
                              f"--runtime-env-agent-port={rt_env}", "--disable-usage-stats", f"--temp-dir={temp}"],
                             env=env, capture_output=True, text=True)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]

    def stop() -> None:
        if not os.path.isdir(temp):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            subprocess.run(["pkill", f"-{sig.name[3:]}", "-f", temp], capture_output=True)
            _kill_holding(temp, sig)
            time.sleep(2)
        shutil.rmtree(temp, ignore_errors=True)

    _HEAD_STOPS.append(stop)
    try:
        yield ray, f"http://127.0.0.1:{dash}", f"127.0.0.1:{port}", env
    finally:
        stop()


# The head's teardown, callable before the session ends, and the session's tests on the head this
# process has not run yet (None until the first of them ends: `pytest_runtest_teardown`)
_HEAD_STOPS: list = []
_HEAD_TESTS_LEFT: set | None = None


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    """Stop the real head once this process has run the last of the session's tests on it: an idle
    head costs about 3 CPU s a minute (its dashboard and agents), and the worker that ran its tests
    goes on with others for minutes while the machine is busy."""
    global _HEAD_TESTS_LEFT
    if not _on_the_head(item.nodeid):
        return
    if _HEAD_TESTS_LEFT is None:
        _HEAD_TESTS_LEFT = {i.nodeid for i in item.session.items if _on_the_head(i.nodeid)}
    _HEAD_TESTS_LEFT.discard(item.nodeid)
    if not _HEAD_TESTS_LEFT:
        while _HEAD_STOPS:
            _HEAD_STOPS.pop()()


def _kill_holding(temp: str, sig: int) -> None:
    """Signal every process with a file open under ``temp``: Ray's agents retitle themselves
    (ray::DashboardAgent), so `pkill -f` misses them and they outlived the head, using CPU
    while the rest of the suite ran; their log files under the head's temp dir give them away."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd).startswith(temp) for fd in (proc / "fd").iterdir()):
                os.kill(int(proc.name), sig)
        except OSError:  # gone meanwhile, or not ours to read
            continue


def _submit(ray_head, job: list[str], env_vars: dict | None = None) -> subprocess.CompletedProcess:
    ray, dashboard, _, env = ray_head
    runtime_env = json.dumps({"env_vars": {"HF_HUB_OFFLINE": "1", **(env_vars or {})}})
    for _ in range(20):  # the head's job agent comes up a few seconds after `ray start`
        proc = subprocess.run(
            [ray, "job", "submit", "--address", dashboard, "--working-dir", str(ROOT),
             "--runtime-env-json", runtime_env, "--", "python", *job],
            env=env, capture_output=True, text=True, timeout=1500, cwd=ROOT)  # a hang guard
        if "No available agent" not in proc.stderr + proc.stdout:
            break
        time.sleep(3)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "succeeded" in proc.stdout
    return proc


class CharTokenizer:
    """Character-level tokenizer stand-in for the vLLM tests: one token per character; token 0 is EOS."""

    all_special_ids = [0]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i or not skip_special_tokens)

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}

