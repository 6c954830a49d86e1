"""Java runners: java-main (HumanEval-X/MBXP) and junit5 (NaturalCodeBench), escapes included."""

from __future__ import annotations

import os
import shutil

import pytest

from leakray.sandbox import Sandbox, SandboxConfig
from leakray.sandbox.java import java_files, junit_has_vintage, junit_jars, manifest_codebases, split_units
from leakray.schema import X

pytestmark = pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK")

SOLUTION = "import java.util.*;\n\nclass Solution {\n    public int add(int a, int b) { return a + b; }\n}\n"
MAIN = ("public class Main {\n    public static void main(String[] args) {\n"
        "        List<Integer> l = Arrays.asList(1, 2);\n"
        "        if (new Solution().add(l.get(0), l.get(1)) != 3) throw new AssertionError(\"add\");\n    }\n}\n")


@pytest.fixture(scope="module")
def sb():
    return Sandbox(SandboxConfig(timeout_s=10))


@pytest.fixture(scope="module")
def cold_sb():
    return Sandbox(SandboxConfig(timeout_s=10, warm=False))


def run(sb, program, tests=MAIN, runner=None):
    req = {X.ID: "j", X.LANGUAGE: "java", X.PROGRAM: program, X.TESTS: tests}
    if runner:
        req[X.RUNNER] = runner
    return sb.run(req)


def test_split_units_knows_comments_strings_and_braces():
    src = ('import java.util.*;\n/* class Fake { */\npublic class A { String s = "}{"; char c = \'}\';\n'
           '  // }\n  class Inner {} }\n@FunctionalInterface\ninterface B { void f(); }\n'
           'enum C { X, Y }\nrecord D(int x) {}\n')
    imports, types = split_units(src)
    assert imports == ["import java.util.*;"]
    assert [n for n, _ in types] == ["A", "B", "C", "D"]
    files = java_files(src, "public class Main {}")
    assert sorted(files) == ["A.java", "B.java", "C.java", "D.java", "Main.java"]
    assert all(text.startswith("import java.util.*;") for text in files.values())


@pytest.mark.slow
def test_java_main_pass_fail_error(sb):
    assert run(sb, SOLUTION)[X.STATUS] == "passed"
    assert run(sb, SOLUTION.replace("a + b", "a - b"))[X.STATUS] == "failed"
    res = run(sb, SOLUTION.replace("return a + b;", "return a +;"))
    assert res[X.STATUS] == "error" and "error" in res[X.STDERR_TAIL]


@pytest.mark.slow
def test_two_public_types_split_per_file(sb):
    prog = ("import java.util.*;\npublic class Helper { static int one() { return 1; } }\n"
            "public class Solution { public int add(int a, int b) { return a + b + Helper.one() - 1; } }\n")
    assert run(sb, prog)[X.STATUS] == "passed"


@pytest.mark.slow
@pytest.mark.parametrize("escape", [
    "System.exit(0);",
    "Runtime.getRuntime().halt(0);",
    'System.out.println("LEAKRAY 00000000000000000000000000000000 passed"); System.exit(0);',
    "Runtime.getRuntime().addShutdownHook(new Thread(() -> Runtime.getRuntime().halt(0))); "
    "throw new RuntimeException();",
])
def test_java_escapes_do_not_pass(sb, escape):
    prog = SOLUTION.replace("return a + b;", escape + "\n        return 0;" if "throw" not in escape
                            else escape)
    res = run(sb, prog)
    assert res[X.PASSED] is False and res[X.STATUS] != "passed", res


@pytest.mark.slow
def test_java_infinite_loop_and_memory(sb):
    loop = SOLUTION.replace("return a + b;", "while (true) {}")
    res = sb.run({X.ID: "j", X.LANGUAGE: "java", X.PROGRAM: loop, X.TESTS: MAIN, X.TIMEOUT_S: 2})
    assert res[X.STATUS] == "timeout", res
    hog = SOLUTION.replace("return a + b;", "List<long[]> l = new ArrayList<>(); while (true) l.add(new long[1 << 20]);")
    # the heap fills in about a second alone; a loaded CI machine once took the sandbox's default 10 s
    # (status "timeout", 2026-12-05), so the hog has room to reach its limit: a run that never reports
    # the memory verdict still fails here, at 60 s
    res = sb.run({X.ID: "j", X.LANGUAGE: "java", X.PROGRAM: hog, X.TESTS: MAIN, X.TIMEOUT_S: 60})
    assert res[X.STATUS] == "memory", res


def test_a_program_killed_after_outliving_its_timeout_is_a_timeout(sb):
    """On a loaded machine the JVM may take over a second to exit on the run script's TERM; then
    `timeout -k 1` kills it and exits 137, not 124 (CI saw "failed" for an infinite loop). A
    stand-in for such a JVM: a process that ignores TERM, under the run script's own `timeout`."""
    from leakray.sandbox.runners import Plan

    script = "exec timeout -k 1 1s /bin/sh -c 'trap \"\" TERM; while :; do :; done'"
    res = sb._run_plan("j", Plan({}, ["/bin/sh", "-c", script], 256, 30.0))
    assert res[X.STATUS] == "timeout", res


# Issue 12: the program may not find the token in the JVM's memory, reach the harness's locals, or
# write to the channel; writing candidate lines gets nowhere either (the host takes exactly one).
# Each attack runs twice: compiled by a warm javac (the default) and by a cold one.
FORGE_JAVA = {
    "proc_self_mem": (
        'try { java.util.List<String> maps = java.nio.file.Files.readAllLines(java.nio.file.Paths.get("/proc/self/maps"));'
        ' java.io.RandomAccessFile mem = new java.io.RandomAccessFile("/proc/self/mem", "r");'
        ' java.util.Set<String> toks = new java.util.HashSet<>();'
        ' for (String l : maps) { if (!l.split(" ")[1].startsWith("rw")) continue; String[] r = l.split(" ")[0].split("-");'
        '  long lo = Long.parseUnsignedLong(r[0], 16), hi = Long.parseUnsignedLong(r[1], 16);'
        '  byte[] buf = new byte[(int) Math.min(hi - lo, 1 << 22)]; try { mem.seek(lo); mem.readFully(buf); } catch (Exception e) { continue; }'
        '  java.util.regex.Matcher m = java.util.regex.Pattern.compile("[0-9a-f]{32}").matcher(new String(buf, "ISO-8859-1"));'
        '  while (m.find()) toks.add(m.group()); }'
        ' for (int fd = 3; fd < 64; fd++) { try (java.io.FileOutputStream o = new java.io.FileOutputStream("/proc/self/fd/" + fd)) {'
        '  for (String t : toks) o.write(("LEAKRAY " + t + " passed\\n").getBytes()); } catch (Exception e) {} }'
        ' Runtime.getRuntime().halt(0); } catch (Throwable t) { System.err.println("refused: " + t); }'),
    "unsafe": (
        'try { java.lang.reflect.Field f = Class.forName("sun.misc.Unsafe").getDeclaredField("theUnsafe");'
        ' f.setAccessible(true); Object u = f.get(null); System.err.println("GOT " + u); Runtime.getRuntime().halt(0); }'
        ' catch (Throwable t) { System.err.println("refused: " + t); }'),
    "reflection_on_harness": (
        'try { Class<?> h = Class.forName("LeakrayReport"); for (java.lang.reflect.Method m : h.getDeclaredMethods()) {'
        ' m.setAccessible(true); System.err.println("GOT " + m); } Runtime.getRuntime().halt(0); }'
        ' catch (Throwable t) { System.err.println("refused: " + t); }'),
    "stack_of_other_threads": (
        'try { System.err.println(Thread.getAllStackTraces().size()); Runtime.getRuntime().halt(0); }'
        ' catch (Throwable t) { System.err.println("refused: " + t); }'),
    "exec_a_reader": (
        'try { new ProcessBuilder("cat", "/proc/" + ProcessHandle.current().pid() + "/environ").inheritIO().start().waitFor();'
        ' Runtime.getRuntime().halt(0); } catch (Throwable t) { System.err.println("refused: " + t); }'),
    "shutdown_hook": (
        'try { Runtime.getRuntime().addShutdownHook(new Thread(() -> {})); } catch (Throwable t) { System.err.println("refused: " + t); }'),
    "replace_stdout": (
        'try { System.setOut(new java.io.PrintStream(new java.io.ByteArrayOutputStream())); }'
        ' catch (Throwable t) { System.err.println("refused: " + t); }'),
}


@pytest.mark.slow
@pytest.mark.parametrize("attack", sorted(FORGE_JAVA))
@pytest.mark.parametrize("compiled", ["warm", "cold"])
def test_java_forgery_is_refused(sb, cold_sb, attack, compiled):
    prog = SOLUTION.replace("return a + b;", FORGE_JAVA[attack] + "\n        return a - b;")
    res = run(sb if compiled == "warm" else cold_sb, prog)
    assert res[X.PASSED] is False and res[X.STATUS] != "passed", res
    assert "refused: java.security.AccessControlException" in res[X.STDERR_TAIL], res  # the policy said no


@pytest.mark.slow
def test_java_program_may_write_its_own_files_only(sb):
    body = ('try { java.nio.file.Files.writeString(java.nio.file.Paths.get("x.txt"), "hi"); } catch (Exception e) { return -1; }'
            ' try { java.nio.file.Files.write(java.nio.file.Paths.get("../.h/Evil.class"), new byte[1]); return -2; }'
            ' catch (SecurityException e) { } catch (Exception e) { return -3; } return a + b;')
    res = run(sb, SOLUTION.replace("return a + b;", body))
    assert res[X.STATUS] == "passed", res


def test_reserved_prefix_is_refused(sb):
    res = run(sb, SOLUTION + "class LeakrayHarness$Evil {}\n")
    assert res[X.STATUS] == "error" and "reserved" in res[X.STDERR_TAIL], res


JUNIT_PROG = "```java\npublic class Calc {\n    public static int twice(int x) { return 2 * x; }\n}\n```"
JUNIT_TESTS = ("import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n\n"
               "class CalcTest {\n    @Test\n    void twice() { assertEquals(4, Calc.twice(2)); }\n"
               "    @Test\n    void zero() { assertEquals(0, Calc.twice(0)); }\n}\n")


@pytest.mark.slow
def test_junit5(sb):
    if not junit_jars(sb.config.junit_classpath):
        pytest.skip("no JUnit 5 jars offline (set LEAKRAY_JUNIT_CLASSPATH)")
    prog = JUNIT_PROG.strip("`").removeprefix("java\n")
    res = run(sb, prog, JUNIT_TESTS, runner="junit5")
    assert res[X.STATUS] == "passed", res
    res = run(sb, prog.replace("2 * x", "x + 2"), JUNIT_TESTS, runner="junit5")
    assert res[X.STATUS] == "failed", res
    res = run(sb, prog.replace("return 2 * x;", "System.exit(0); return 0;"), JUNIT_TESTS, runner="junit5")
    assert res[X.STATUS] == "failed", res
    for attack in ("proc_self_mem", "unsafe", "reflection_on_harness"):  # the jars may, the tests may not
        res = run(sb, prog.replace("return 2 * x;", FORGE_JAVA[attack] + "\n        return x;"), JUNIT_TESTS,
                  runner="junit5")
        assert res[X.STATUS] == "failed" and "AccessControlException" in res[X.STDERR_TAIL], (attack, res)


# NaturalCodeBench's Java tests are partly JUnit 4, and many compare Chinese text
JUNIT4_PROG = ("public class Greeter {\n    public static String greet(String n) { return \"你好，\" + n; }\n"
               "    public static int utf8Bytes(String s) { return s.getBytes().length; }\n}\n")
JUNIT4_TESTS = ("import org.junit.Test;\nimport org.junit.Before;\nimport static org.junit.Assert.*;\n\n"
                "public class GreeterTest {\n    private String name;\n\n    @Before\n"
                "    public void setUp() { name = \"世界\"; }\n\n"
                "    @Test\n    public void greets() { assertEquals(\"你好，世界\", Greeter.greet(name)); }\n\n"
                "    @Test\n    public void defaultCharsetIsUtf8() { assertEquals(6, Greeter.utf8Bytes(\"中文\")); }\n}\n")


def _vintage_jars(sb):
    jars = junit_jars(sb.config.junit_classpath)
    if not jars or not junit_has_vintage(jars):
        pytest.skip("no JUnit 4 + vintage jars offline (scripts/install.sh installs Debian's junit5)")
    return jars


@pytest.mark.slow
def test_junit4_classes_run_on_the_vintage_engine(sb):
    _vintage_jars(sb)
    res = run(sb, JUNIT4_PROG, JUNIT4_TESTS, runner="junit5")
    assert res[X.STATUS] == "passed", res
    # the engine must have had every permission it needs, or it warns and degrades
    assert "AccessControlException" not in res[X.STDERR_TAIL], res
    res = run(sb, JUNIT4_PROG.replace("你好，", "您好，"), JUNIT4_TESTS, runner="junit5")
    assert res[X.STATUS] == "failed" and "greets" in res[X.STDERR_TAIL], res
    res = run(sb, JUNIT4_PROG.replace("s.getBytes()", "s.getBytes(java.nio.charset.StandardCharsets.UTF_16BE)"),
              JUNIT4_TESTS, runner="junit5")
    assert res[X.STATUS] == "failed", res


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["proc_self_mem", "unsafe", "reflection_on_harness"])
def test_junit4_tests_get_no_more_permission_than_jupiter(sb, attack):
    _vintage_jars(sb)
    prog = JUNIT4_PROG.replace('return "你好，" + n;', FORGE_JAVA[attack] + '\n        return "";')
    res = run(sb, prog, JUNIT4_TESTS, runner="junit5")
    assert res[X.STATUS] == "failed" and "refused: java.security.AccessControlException" in res[X.STDERR_TAIL], res


def test_junit4_without_the_vintage_engine_says_so(sb):
    jars = [j for j in _vintage_jars(sb) if "vintage" not in j and "junit4" not in j and "junit-4" not in j]
    sb2 = Sandbox(SandboxConfig(timeout_s=10, junit_classpath=":".join(jars)))
    res = run(sb2, JUNIT4_PROG, JUNIT4_TESTS, runner="junit5")
    assert res[X.STATUS] == "error" and "vintage" in res[X.STDERR_TAIL], res


def _jar(path, class_path=None):
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        manifest = "Manifest-Version: 1.0\r\n"
        if class_path is not None:  # wrapped as jar tools write it: 72 bytes a line, continued after a space
            line = "Class-Path: " + class_path
            manifest += "\r\n ".join(line[i:i + 70] for i in range(0, len(line), 70)) + "\r\n"
        z.writestr("META-INF/MANIFEST.MF", manifest + "Created-By: test\r\n\r\n")


def test_manifest_codebases_follow_class_path_transitively(tmp_path):
    share, bound = tmp_path / "share", "/tmp/.junit"
    share.mkdir()
    _jar(share / "dep-one-with-a-long-name-so-the-manifest-wraps.jar", "dep-two.jar missing.jar")
    _jar(share / "dep-two.jar")
    _jar(share / "lone.jar")
    _jar(share / "engine.jar", f"{share}/dep-one-with-a-long-name-so-the-manifest-wraps.jar sibling.jar "
                               "http://example.invalid/x.jar")
    got = manifest_codebases([str(share / "engine.jar"), str(share / "lone.jar")], bound)
    # sibling.jar resolves beside the bound copy (granted already); missing.jar and the URL load nothing
    assert got == [f"{share}/dep-one-with-a-long-name-so-the-manifest-wraps.jar", f"{share}/dep-two.jar"]


def test_jdk_without_security_manager_is_refused(sb, monkeypatch):
    from leakray.sandbox import runners

    monkeypatch.setitem(runners._JAVA_MAJOR, runners.java_bin(sb.config, "java"), 24)
    res = run(sb, SOLUTION)
    assert res[X.STATUS] == "error" and "JDK 17-23" in res[X.STDERR_TAIL], res


# ---- the warm javac (sandbox/javac_warm.py) -----------------------------------------------------
PARITY = {  # each a verdict the cold javac gives; the warm one must give the same
    "pass": SOLUTION,
    "fail": "import java.util.*;\nclass Solution {\n    public int add(int a, int b) { return a - b; }\n}\n",
    "compile": "import java.util.*;\nclass Solution {\n    public int add(int a, int b) { return c; }\n}\n",
    "throws": "import java.util.*;\nclass Solution {\n    public int add(int a, int b) { throw new RuntimeException(\"boom\"); }\n}\n",
    "exit": "import java.util.*;\nclass Solution {\n    public int add(int a, int b) { System.exit(0); return 3; }\n}\n",
    # nested and anonymous classes and a lambda: class files beyond one per source
    "inner": ("import java.util.*;\nclass Solution {\n    static class Box { int v; Box(int v) { this.v = v; } }\n"
              "    public int add(int a, int b) {\n        Runnable r = new Runnable() { public void run() {} };\n"
              "        r.run();\n        java.util.function.IntBinaryOperator f = (x, y) -> new Box(x + y).v;\n"
              "        return f.applyAsInt(a, b);\n    }\n}\n"),
    # the harness's classes arrive in .h/, read-only: writing there is refused as before
    "write_h": ("import java.util.*;\nclass Solution {\n    public int add(int a, int b) {\n        try {\n"
                "            java.nio.file.Files.write(java.nio.file.Paths.get(System.getProperty(\"leakray.work\"), "
                "\".h\", \"LeakrayHarness.class\"), new byte[1]);\n"
                "        } catch (Exception e) { throw new RuntimeException(e); }\n        return a + b;\n    }\n}\n"),
}


def _jvm_of(server) -> int:
    """The pid of a warm javac's JVM: its bubblewrap's descendant named java."""
    import os

    parent = {}
    for proc in os.listdir("/proc"):
        try:
            if proc.isdigit():
                stat = open(f"/proc/{proc}/stat").read()
                parent[int(proc)] = (int(stat.rsplit(")", 1)[1].split()[1]), stat.split("(", 1)[1].rsplit(")", 1)[0])
        except OSError:
            continue
    for pid, (_, comm) in parent.items():
        up = pid
        while up in parent and up != server.proc.pid:
            up = parent[up][0]
        if up == server.proc.pid and comm == "java":
            return pid
    raise AssertionError("no JVM under the warm javac's bubblewrap")


def _gone(pid: int, within_s: float = 10.0) -> bool:
    import time

    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX":
                return True  # dead, waiting for its reaper
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_warm_javac_gives_the_cold_verdicts():
    cold = Sandbox(SandboxConfig(timeout_s=10, warm=False))
    warm = Sandbox(SandboxConfig(timeout_s=10))
    if warm._javacs is None:
        pytest.skip("warm runs need root and bubblewrap")
    try:
        got = {warm_: {name: run(sb, p) for name, p in PARITY.items()} for warm_, sb in ((False, cold), (True, warm))}
        assert {n: r[X.STATUS] for n, r in got[True].items()} == {n: r[X.STATUS] for n, r in got[False].items()}
        assert {n: r[X.STATUS] for n, r in got[True].items()} == {
            "pass": "passed", "fail": "failed", "compile": "error", "throws": "failed", "exit": "failed",
            "inner": "passed", "write_h": "failed"}
        # javac's own words, naming the source as a cold javac in the work dir does
        assert got[True]["compile"][X.STDERR_TAIL] == got[False]["compile"][X.STDERR_TAIL]
        assert "Solution.java:4: error: cannot find symbol" in got[True]["compile"][X.STDERR_TAIL]
        # the runs were compiled warm, by one server per concurrent slot, never as root
        (pool,) = warm._javacs.values()
        assert len(pool._idle) == 1 and pool._idle[0].compiles == len(PARITY)
        server = pool._idle[0]
        jvm = _jvm_of(server)
        assert open(f"/proc/{jvm}/status").read().split("\nUid:\t")[1].split("\t")[0] != "0"
    finally:
        warm.close()
    # closed with the sandbox: its bubblewrap at once, the JVM as the kernel tears its namespace down
    assert server.proc.poll() is not None and _gone(jvm)


@pytest.mark.slow
def test_a_warm_javac_past_its_grace_is_a_timeout_and_the_next_run_compiles_anew():
    sb = Sandbox(SandboxConfig(timeout_s=10, compile_grace_s=0.05))
    if sb._javacs is None:
        pytest.skip("warm runs need root and bubblewrap")
    try:
        run(sb, SOLUTION)  # starts the server (its start is not the compile's)
        r = run(sb, SOLUTION)
        assert r[X.STATUS] == "timeout" and "javac did not finish within 0.05 s" in r[X.STDERR_TAIL]
        (pool,) = sb._javacs.values()
        assert not pool._idle  # the server that overran was killed, not given back
        sb.config.compile_grace_s = 20.0
        assert run(sb, SOLUTION)[X.STATUS] == "passed"
    finally:
        sb.close()


@pytest.mark.slow
def test_a_warm_javac_that_fails_leaves_the_run_to_a_cold_javac(monkeypatch):
    from leakray.sandbox import javac_warm

    def dies(self, *args, **kwargs):
        self.close()
        return None
    monkeypatch.setattr(javac_warm.JavacServer, "compile", dies)
    sb = Sandbox(SandboxConfig(timeout_s=10))
    try:
        assert run(sb, SOLUTION)[X.STATUS] == "passed"
        assert run(sb, PARITY["fail"])[X.STATUS] == "failed"
    finally:
        sb.close()


@pytest.mark.slow
def test_a_warm_javac_that_cannot_start_leaves_every_run_to_the_cold_javac(monkeypatch):
    from leakray.sandbox import core, javac_warm

    monkeypatch.setattr(javac_warm, "SERVER_JAVA", "class LeakrayJavac { not java }")
    sb = Sandbox(SandboxConfig(timeout_s=10))
    if sb._javacs is None:
        pytest.skip("warm runs need root and bubblewrap")
    try:
        assert run(sb, SOLUTION)[X.STATUS] == "passed"
        assert list(sb._javacs.values()) == [core._COLD]  # not tried again for every run
        assert run(sb, PARITY["fail"])[X.STATUS] == "failed"
    finally:
        sb.close()


@pytest.mark.slow
def test_a_warm_javac_retires_after_its_compiles_and_a_new_one_takes_over(monkeypatch):
    from leakray.sandbox import javac_warm

    monkeypatch.setattr(javac_warm, "MAX_COMPILES", 2)
    sb = Sandbox(SandboxConfig(timeout_s=10))
    if sb._javacs is None:
        pytest.skip("warm runs need root and bubblewrap")
    try:
        assert run(sb, SOLUTION)[X.STATUS] == "passed"
        (pool,) = sb._javacs.values()
        (first,) = pool._idle
        assert run(sb, SOLUTION)[X.STATUS] == "passed"
        assert not pool._idle and first.proc.poll() is not None  # retired and reaped, not given back
        assert run(sb, PARITY["fail"])[X.STATUS] == "failed"
        assert len(pool._idle) == 1 and pool._idle[0].compiles == 1
    finally:
        sb.close()
