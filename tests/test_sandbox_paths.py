"""The sandbox must work wherever leakray and its interpreter are installed: a checkout
under /tmp (masked by the private tmpfs) or an interpreter under /root (hidden)."""

from leakray.sandbox import isolation as iso


def test_masked_install_prefixes_and_package_dir_are_bound_back():
    binds = iso.exposed_paths(["/tmp/ci/.venv/bin/python", "/usr/bin/python3"], ["/tmp/ci/leakray/sandbox"])
    assert ("/tmp/ci/.venv", "/tmp/ci/.venv") in binds
    assert ("/tmp/ci/leakray/sandbox", "/tmp/ci/leakray/sandbox") in binds
    assert all(not src.startswith("/usr") for src, _ in binds)  # already visible read-only
    assert ("/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7") in iso.exposed_paths(
        ["/root/.pyenv/versions/3.11.7/bin/python3"])
