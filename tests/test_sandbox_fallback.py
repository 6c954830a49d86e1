"""Without bubblewrap the sandbox refuses to run unless opted in, and then says, once and loudly,
which isolation it fell back to."""

from __future__ import annotations

import pytest

from leakray.errors import BadInput
from leakray.sandbox import Sandbox, SandboxConfig
from leakray.sandbox import isolation as iso
from leakray.schema import X


def test_fallback_is_announced_once_and_still_judges(monkeypatch, capsys):
    monkeypatch.setattr(iso, "_detected", {})
    monkeypatch.setattr(iso, "_warned", set())
    sb = Sandbox(SandboxConfig(isolation="none", timeout_s=5, allow_weak_isolation=True))
    Sandbox(SandboxConfig(isolation="none", timeout_s=5, allow_weak_isolation=True))
    err = capsys.readouterr().err
    assert sb.isolation == "none"
    assert err.count("falling back to rlimits only") == 1 and "NETWORK" in err
    req = {X.ID: "a", X.LANGUAGE: "python", X.PROGRAM: "def f():\n    return 1\n", X.TESTS: "assert f() == 1\n"}
    assert sb.run(req)[X.STATUS] == "passed"
    assert sb.run(dict(req, **{X.TESTS: "assert f() == 2\n"}))[X.STATUS] == "failed"
    escape = dict(req, **{X.PROGRAM: "import os\nos._exit(0)\n", X.TESTS: "assert False\n"})
    assert sb.run(escape)[X.PASSED] is False
    assert sb.run(dict(req, **{X.PROGRAM: "while True:\n    pass\n", X.TIMEOUT_S: 1}))[X.STATUS] == "timeout"


def test_weak_isolation_is_refused_unless_opted_in(monkeypatch, capsys):
    monkeypatch.setattr(iso, "_detected", {})
    monkeypatch.setattr(iso, "_warned", set())
    for level in ("none", "unshare"):
        with pytest.raises(BadInput) as err:
            Sandbox(SandboxConfig(isolation=level))
        msg = str(err.value)
        assert "\n" not in msg and "apt-get install bubblewrap" in msg and "execute.allow_weak_isolation" in msg
    assert "falling back" not in capsys.readouterr().err  # refused, not run weakly


def test_execute_cli_refuses_weak_isolation_without_the_flag(tmp_path, monkeypatch, capsys):
    import json

    from leakray.cli import main

    monkeypatch.setattr(iso, "detect", lambda *a, **k: iso.NONE)
    inp, out = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": "a", "language": "python", "program": "x = 1\n", "tests": "assert x == 1\n"}) + "\n")
    assert main(["execute", "--input", str(inp), "--output", str(out)]) == 2
    assert "allow_weak_isolation" in capsys.readouterr().err
    assert main(["execute", "--input", str(inp), "--output", str(out), "--allow-weak-isolation"]) == 0
    assert json.loads(out.read_text())["status"] == "passed"
    assert "isolation: none" in capsys.readouterr().err
