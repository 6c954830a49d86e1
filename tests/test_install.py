"""scripts/uv_install.py: pip's settings become uv's flags, or uv is not used at all."""

import importlib.util
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def uv_install():
    spec = importlib.util.spec_from_file_location("uv_install", ROOT / "scripts" / "uv_install.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pip_config(monkeypatch, mod, text: str) -> None:
    monkeypatch.setattr(mod.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=text))


def test_pip_settings_read_every_scope_and_the_environment_wins(uv_install, monkeypatch):
    _pip_config(monkeypatch, uv_install, "\n".join([
        "global.find-links='/opt/wheels'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        "global.timeout='60'",
        "install.timeout='90'",
        ":env:.timeout='180'",
        ":env:.disable-pip-version-check='1'",
        "not a setting line",
    ]))
    assert uv_install.pip_settings() == {
        "find-links": "/opt/wheels", "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
        "constraint": "/etc/xdg/pip/constraints.txt", "timeout": "180", "disable-pip-version-check": "1"}


def test_known_settings_become_uv_flags_and_environment(uv_install):
    flags, env = uv_install.uv_command({
        "find-links": "/opt/wheels", "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
        "constraint": "/etc/c.txt", "index-url": "https://mirror/simple", "no-index": "false",
        "cert": "/etc/ssl/certs/ca-certificates.crt", "timeout": "180", "proxy": "http://proxy:3128",
        "disable-pip-version-check": "1"})
    # pip takes the best version over every index; uv by default stops at the first index that has the name
    assert flags[:2] == ["--index-strategy", "unsafe-best-match"]
    pairs = list(zip(flags[2::2], flags[3::2]))
    assert ("--find-links", "/opt/wheels") in pairs and ("--constraint", "/etc/c.txt") in pairs
    assert [v for f, v in pairs if f == "--extra-index-url"] == ["file:///opt/a/simple", "file:///opt/b/simple"]
    assert ("--index-url", "https://mirror/simple") in pairs and "--no-index" not in flags
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180",
                   "HTTPS_PROXY": "http://proxy:3128", "HTTP_PROXY": "http://proxy:3128"}
    assert "--no-index" in uv_install.uv_command({"no-index": "true"})[0]


def test_a_setting_without_a_uv_equivalent_leaves_the_install_to_pip(uv_install, monkeypatch, capsys):
    assert uv_install.uv_command({"find-links": "/opt/wheels", "require-virtualenv": "true"}) is None
    assert "'require-virtualenv'" in capsys.readouterr().err
    _pip_config(monkeypatch, uv_install, ":env:.require-virtualenv='true'\n")
    ran = []
    monkeypatch.setitem(sys.modules, "uv", type(sys)("uv"))
    sys.modules["uv"].find_uv_bin = lambda: ran.append("uv") or "uv"
    assert uv_install.main(["-e", "."]) == uv_install.UNKNOWN_SETTING and ran == []  # uv never started


def test_unreadable_pip_settings_leave_the_install_to_pip(uv_install, monkeypatch, capsys):
    def fails(*a, **k):
        raise subprocess.CalledProcessError(2, a[0])
    monkeypatch.setattr(uv_install.subprocess, "run", fails)
    monkeypatch.setitem(sys.modules, "uv", type(sys)("uv"))
    sys.modules["uv"].find_uv_bin = lambda: "uv"
    assert uv_install.main(["-e", "."]) == uv_install.UNKNOWN_SETTING
    assert "installing with pip" in capsys.readouterr().err
