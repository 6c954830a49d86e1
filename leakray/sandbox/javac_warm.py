"""Warm javac: one long-lived JVM per concurrent slot compiles the Java runners' sources.

A cold `javac` is a JVM start plus the compiler's class loading and JIT warm-up: ~0.6 s wall and
~0.8 CPU s for a HumanEval-X task here, about nine tenths of a Java run. The same compiler kept
running answers the next compile in ~25 ms (`python benchmarks/bench_sandbox.py --java`). So each
worker slot keeps `LeakrayJavac` (below) running in a bubblewrap sandbox of its own, under an
unprivileged uid of its own, with the javac flags the cold path uses; the host sends it a run's
sources and gets back javac's exit status, its diagnostics and the class files, which then go into
the run's own fresh sandbox in place of the javac step (`runners.java_plan`, `core._run_java_warm`).

Only compiling is shared: javac with `-proc:none` runs no code of the sources (no annotation
processors, no plugins), and every program still runs in a JVM of its own, as before. A compile
that outlives the compile grace kills the server (the next run starts a new one) and the run is a
`timeout`, as a cold javac that hangs is; a server that dies or answers nonsense is closed and
that run compiles cold. Each server retires after `MAX_COMPILES` compiles, so javac's caches never
grow without bound.

The wire format is length-prefixed on both sides (big-endian int32 lengths, UTF-8 strings):
  request:  n_args, args..., n_files, (name, bytes)...
  response: rc, diagnostics, n_classes, (relative path, bytes)...
"""

from __future__ import annotations

import os
import select
import struct
import subprocess
import time

from leakray.sandbox import isolation as iso
from leakray.sandbox import warm

MAX_COMPILES = 400  # a server's compiles before it retires (javac's symbol caches, the heap)
MAX_CLASS_BYTES = 32 << 20  # the class files one compile may hand back

SERVER_JAVA = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import java.util.stream.*;
import javax.tools.*;

public class LeakrayJavac {
    static byte[] bytes(DataInputStream in) throws IOException {
        int n = in.readInt();
        if (n < 0 || n > (64 << 20)) throw new IOException("bad length " + n);
        byte[] b = new byte[n];
        in.readFully(b);
        return b;
    }
    static String text(DataInputStream in) throws IOException {
        return new String(bytes(in), StandardCharsets.UTF_8);
    }
    static void put(DataOutputStream out, byte[] b) throws IOException {
        out.writeInt(b.length);
        out.write(b);
    }
    static void delete(Path p) throws IOException {
        try (Stream<Path> s = Files.walk(p)) {
            for (Path q : s.sorted(Comparator.reverseOrder()).collect(Collectors.toList())) Files.delete(q);
        }
    }
    public static void main(String[] a) throws Exception {
        DataInputStream in = new DataInputStream(new BufferedInputStream(System.in));
        DataOutputStream out = new DataOutputStream(new BufferedOutputStream(System.out));
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        Path root = Paths.get(a[0]);
        int left = Integer.parseInt(a[1]);
        out.writeInt(0x4c524a43);  // "LRJC": ready
        out.flush();
        for (; left > 0; left--) {
            int nArgs;
            try { nArgs = in.readInt(); } catch (EOFException e) { return; }
            List<String> args = new ArrayList<>();
            for (int i = 0; i < nArgs; i++) args.add(text(in));
            Path dir = Files.createTempDirectory(root, "c");
            Path src = Files.createDirectory(dir.resolve("src"));
            Path cls = Files.createDirectory(dir.resolve("classes"));
            args.add("-d");
            args.add(cls.toString());
            int nFiles = in.readInt();
            for (int i = 0; i < nFiles; i++) {
                String name = text(in);
                Path p = src.resolve(name).normalize();
                if (!src.equals(p.getParent())) throw new IOException("a source name with a path: " + name);
                Files.write(p, bytes(in));
                args.add(p.toString());
            }
            ByteArrayOutputStream diag = new ByteArrayOutputStream();
            int rc = javac.run(null, diag, diag, args.toArray(new String[0]));
            // diagnostics name the sources as a cold javac run in the work dir does
            String said = new String(diag.toByteArray(), StandardCharsets.UTF_8).replace(src.toString() + "/", "");
            List<Path> made;
            try (Stream<Path> s = Files.walk(cls)) {
                made = s.filter(Files::isRegularFile).sorted().collect(Collectors.toList());
            }
            out.writeInt(rc);
            put(out, said.getBytes(StandardCharsets.UTF_8));
            out.writeInt(rc == 0 ? made.size() : 0);
            if (rc == 0) {
                for (Path p : made) {
                    put(out, cls.relativize(p).toString().getBytes(StandardCharsets.UTF_8));
                    put(out, Files.readAllBytes(p));
                }
            }
            out.flush();
            delete(dir);
        }
    }
}
"""


class CompileTimeout(Exception):
    """The server did not answer within the compile grace (it has been killed)."""


class JavacServer:
    """One warm javac in its own bubblewrap sandbox, as ``uid`` (it never runs as root)."""

    def __init__(self, java: str, jvm_flags: list[str], uid: int, uid_lock: int, work_dir_mb: int,
                 memory_mb: int, max_procs: int, ro_binds, start_timeout_s: float = 60.0):
        self._uid_lock, self.compiles = uid_lock, 0  # the uid's lock is ours to release now
        self.proc: subprocess.Popen | None = None
        try:
            self._start(java, jvm_flags, uid, work_dir_mb, memory_mb, max_procs, ro_binds, start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, java, jvm_flags, uid, work_dir_mb, memory_mb, max_procs, ro_binds, start_timeout_s) -> None:
        src = os.memfd_create("leakray-javac", 0)
        try:
            os.write(src, SERVER_JAVA.encode())
            os.lseek(src, 0, os.SEEK_SET)
            argv = (iso.bwrap_argv(files={"LeakrayJavac.java": src}, work_dir_mb=work_dir_mb,
                                   env=iso.sandbox_env(), ro_binds=ro_binds) + iso.drop_prefix(uid, max_procs)
                    + [java, *jvm_flags, "/tmp/LeakrayJavac.java", "/tmp", str(MAX_COMPILES)])
            # no CPU limit: the server lives for many compiles; each is bounded by the host's wait
            # unbuffered: `_read` waits on the pipe itself, which a reader's buffer would hide
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=[src],
                bufsize=0,
                preexec_fn=iso.preexec(uid=uid, memory_mb=memory_mb, cpu_s=1e7, max_procs=max_procs,
                                       max_file_bytes=MAX_CLASS_BYTES, drop=False))
        finally:
            os.close(src)
        try:
            ready = self._read(4, time.monotonic() + start_timeout_s)
        except (OSError, EOFError, TimeoutError):
            ready = b""
        if ready != b"LRJC":
            raise RuntimeError("the warm javac did not start")

    def compile(self, args: list[str], sources: dict[str, str],
                timeout: float) -> tuple[int, str, dict[str, bytes]] | None:
        """(javac's exit status, its diagnostics, {relative path: class bytes}); None when the
        server is gone or answered nonsense (closed: compile cold). Raises CompileTimeout when
        the whole answer has not come within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            frame = [struct.pack(">i", len(args))] + [_blob(a.encode()) for a in args]
            frame += [struct.pack(">i", len(sources))]
            frame += [_blob(name.encode()) + _blob(text.encode("utf-8")) for name, text in sources.items()]
            data = memoryview(b"".join(frame))
            while data:
                data = data[self.proc.stdin.write(data):]
            rc = struct.unpack(">i", self._read(4, deadline))[0]
            said = self._blob(deadline).decode("utf-8", errors="replace")
            classes, total = {}, 0
            for _ in range(struct.unpack(">i", self._read(4, deadline))[0]):
                name = self._blob(deadline).decode("utf-8")
                data = self._blob(deadline)
                total += len(data)
                if total > MAX_CLASS_BYTES or name.startswith("/") or ".." in name.split("/"):
                    raise ValueError("class files past the limit, or a name outside the class dir")
                classes[name] = data
        except TimeoutError:
            self.close()
            raise CompileTimeout from None
        except (OSError, ValueError, EOFError, struct.error):
            self.close()
            return None
        self.compiles += 1
        return rc, said, classes

    def _blob(self, deadline: float) -> bytes:
        n = struct.unpack(">i", self._read(4, deadline))[0]
        if not 0 <= n <= MAX_CLASS_BYTES:
            raise ValueError(f"bad length {n}")
        return self._read(n, deadline)

    def _read(self, n: int, deadline: float) -> bytes:
        """``n`` bytes of the answer, all of them by ``deadline`` (time.monotonic's clock)."""
        out, got = self.proc.stdout, b""
        while len(got) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise TimeoutError
            chunk = out.read(n - len(got))
            if not chunk:
                raise EOFError
            got += chunk
        return got

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.compiles < MAX_COMPILES

    def close(self) -> None:
        warm.stop(self.proc)
        if self._uid_lock is not None:
            iso.UidPool.release(self._uid_lock)
            self._uid_lock = None


def _blob(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data
