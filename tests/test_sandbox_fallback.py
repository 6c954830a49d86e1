"""Without bubblewrap the sandbox says, once and loudly, which isolation it fell back to."""

from __future__ import annotations

from leakray.sandbox import Sandbox, SandboxConfig
from leakray.sandbox import isolation as iso
from leakray.schema import X


def test_fallback_is_announced_once_and_still_judges(monkeypatch, capsys):
    monkeypatch.setattr(iso, "_detected", {})
    monkeypatch.setattr(iso, "_warned", set())
    sb = Sandbox(SandboxConfig(isolation="none", timeout_s=5))
    Sandbox(SandboxConfig(isolation="none", timeout_s=5))
    err = capsys.readouterr().err
    assert sb.isolation == "none"
    assert err.count("falling back to rlimits only") == 1 and "NETWORK" in err
    req = {X.ID: "a", X.LANGUAGE: "python", X.PROGRAM: "def f():\n    return 1\n", X.TESTS: "assert f() == 1\n"}
    assert sb.run(req)[X.STATUS] == "passed"
    assert sb.run(dict(req, **{X.TESTS: "assert f() == 2\n"}))[X.STATUS] == "failed"
    escape = dict(req, **{X.PROGRAM: "import os\nos._exit(0)\n", X.TESTS: "assert False\n"})
    assert sb.run(escape)[X.PASSED] is False
    assert sb.run(dict(req, **{X.PROGRAM: "while True:\n    pass\n", X.TIMEOUT_S: 1}))[X.STATUS] == "timeout"
