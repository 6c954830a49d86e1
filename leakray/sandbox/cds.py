"""A class-data-sharing archive for javac: ~40% less CPU per Java run (javac's startup dominates).

Built once per host and JVM flag set, by us, outside any sandbox, from a fixed sample; bound
read-only into each run. A missing or stale archive only costs speed (the JVM runs -Xshare:auto)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading

_lock = threading.Lock()
_cache: dict[str, str | None] = {}

_SAMPLE = """import java.util.*;
import java.util.function.*;
import java.util.stream.*;
class Solution {
    public List<Integer> f(List<Integer> xs) {
        Map<Integer, Integer> m = new HashMap<>();
        for (int x : xs) m.merge(x, 1, Integer::sum);
        return xs.stream().filter(x -> m.get(x) > 0).sorted().collect(Collectors.toList());
    }
}
public class Main {
    public static void main(String[] args) throws Exception {
        if (!new Solution().f(Arrays.asList(3, 1, 2)).equals(Arrays.asList(1, 2, 3))) throw new AssertionError();
    }
}
"""


def javac_archive(javac: str, jflags: list[str]) -> str | None:
    """Path of the archive for `javac` run with `jflags` (the -J options), building it if needed."""
    key = hashlib.sha256("\0".join([os.path.realpath(_which(javac))] + jflags).encode()).hexdigest()[:16]
    with _lock:
        if key in _cache:
            return _cache[key]
        path = os.path.join(tempfile.gettempdir(), "leakray-cds", f"javac-{key}.jsa")
        if not os.path.isfile(path):
            try:
                _build(javac, jflags, path)
            except (OSError, subprocess.SubprocessError):
                pass
        _cache[key] = path if os.path.isfile(path) else None
        return _cache[key]


def _which(tool: str) -> str:
    from shutil import which

    return which(tool) or tool


def _build(javac: str, jflags: list[str], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "Main.java"), "w") as fh:
            fh.write(_SAMPLE)
        tmp = os.path.join(work, "javac.jsa")
        subprocess.run([javac, *jflags, f"-J-XX:ArchiveClassesAtExit={tmp}", "-d", os.path.join(work, "out"),
                        os.path.join(work, "Main.java")], cwd=work, check=True, timeout=300,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # atomic: concurrent builders on one host never see half a file
