"""Java sources for javac: split top-level types one per file, plus the harness classes.

javac wants a public top-level type in a file of its own name; benchmark sources put several
(`Solution` + `Main`, NCB's `public class A` + `public class B`) in one text. Every file gets
the imports of both sources, as compiling them together in one unit would have given."""

from __future__ import annotations

import glob
import os
import re
import zipfile

_TYPE = re.compile(r"\b(class|interface|enum|record)\s+([A-Za-z_$][\w$]*)")


def _top_level_chunks(src: str) -> list[str]:
    """Top-level chunks: `import ...;` / `package ...;` statements and whole type declarations.

    A small scanner that knows comments, strings, chars and text blocks, so braces inside them
    do not count."""
    chunks, start, depth, i, n = [], 0, 0, 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if src.startswith('"""', i):
            j = src.find('"""', i + 3)
            while j > 0 and src[j - 1] == "\\":
                j = src.find('"""', j + 1)
            i = n if j < 0 else j + 3
            continue
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            i = j + 1
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                chunks.append(src[start:i + 1])
                start = i + 1
        elif c == ";" and depth == 0:
            chunks.append(src[start:i + 1])
            start = i + 1
        i += 1
    if src[start:].strip():
        chunks.append(src[start:])
    return chunks


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def split_units(src: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(import lines, [(type name, declaration text)]) of one Java source text."""
    imports, types = [], []
    for chunk in _top_level_chunks(src):
        head = _strip_comments(chunk).strip()
        if not head or head == ";":
            continue
        if head.startswith("import "):
            imports.append(head)
        elif head.startswith("package "):
            continue  # everything compiles into the default package
        else:
            brace = head.find("{")
            header = re.sub(r"@interface\b", "interface", head[:brace if brace >= 0 else len(head)])
            header = re.sub(r"@\w+(\.\w+)*(\([^)]*\))?", " ", header)  # annotations
            match = _TYPE.search(header)
            # an unnamed chunk (stray code) still goes to javac, which will say what is wrong
            types.append((match.group(2) if match else "Unnamed", chunk.strip() + "\n"))
    return imports, types


def java_files(*sources: str) -> dict[str, str]:
    """{file name: text} for javac, one top-level type per file."""
    imports: list[str] = []
    types: list[tuple[str, str]] = []
    for src in sources:
        imp, typ = split_units(src)
        imports += [i for i in imp if i not in imports]
        types += typ
    header = "\n".join(imports) + "\n\n" if imports else ""
    files: dict[str, str] = {}
    for name, text in types:
        fname, k = f"{name}.java", 2
        while fname in files:  # a duplicate type: javac reports it
            fname, k = f"{name}__dup{k}.java", k + 1
        files[fname] = header + text
    return files


def type_names(src: str) -> list[str]:
    return [name for name, _ in split_units(src)[1]]


# The frame both harnesses share: the token is taken before any untrusted code runs, and one
# verdict line goes out on the channel fd whatever the run did (LeakrayReport.send halts the JVM).
_HARNESS_OPEN = r"""
public final class LeakrayHarness {
    public static void main(String[] args) throws Exception {
        byte[] token = LeakrayReport.takeToken();  // a local: not reachable by reflection, unlike a field
        java.io.FileOutputStream out = LeakrayReport.channel(args[0]);
        String status;
        try {
"""
_HARNESS_CLOSE = r"""        LeakrayReport.send(out, token, status);
    }
}
"""

MAIN_HARNESS = _HARNESS_OPEN + r"""            java.lang.reflect.Method m = Class.forName("Main").getDeclaredMethod("main", String[].class);
            m.setAccessible(true);
            m.invoke(null, (Object) new String[0]);
            status = "passed";
        } catch (java.lang.reflect.InvocationTargetException e) {
            Throwable cause = e.getCause();
            cause.printStackTrace();
            status = cause instanceof OutOfMemoryError ? "memory" : "failed";
        } catch (ClassNotFoundException | NoSuchMethodException e) {
            e.printStackTrace();
            status = "error";
        } catch (Throwable e) {
            e.printStackTrace();
            status = e instanceof OutOfMemoryError ? "memory" : "failed";
        }
""" + _HARNESS_CLOSE

JUNIT_HARNESS = r"""
import org.junit.platform.launcher.Launcher;
import org.junit.platform.launcher.LauncherDiscoveryRequest;
import org.junit.platform.launcher.core.LauncherDiscoveryRequestBuilder;
import org.junit.platform.launcher.core.LauncherFactory;
import org.junit.platform.launcher.listeners.SummaryGeneratingListener;
import org.junit.platform.launcher.listeners.TestExecutionSummary;
import org.junit.platform.engine.discovery.DiscoverySelectors;
""" + _HARNESS_OPEN + r"""            LauncherDiscoveryRequestBuilder b = LauncherDiscoveryRequestBuilder.request();
            for (int i = 1; i < args.length; i++) b.selectors(DiscoverySelectors.selectClass(Class.forName(args[i])));
            Launcher launcher = LauncherFactory.create();
            SummaryGeneratingListener listener = new SummaryGeneratingListener();
            launcher.execute(b.build(), listener);
            TestExecutionSummary s = listener.getSummary();
            java.io.PrintWriter err = new java.io.PrintWriter(System.err);
            s.printTo(err);
            s.printFailuresTo(err, 25);
            err.flush();
            boolean oom = false;
            for (TestExecutionSummary.Failure f : s.getFailures()) oom |= f.getException() instanceof OutOfMemoryError;
            status = s.getTestsFoundCount() > 0 && s.getTotalFailureCount() == 0 && s.getTestsSucceededCount() > 0
                    ? "passed" : oom ? "memory" : "failed";
        } catch (Throwable e) {
            e.printStackTrace();
            status = e instanceof OutOfMemoryError ? "memory" : "error";
        }
""" + _HARNESS_CLOSE

REPORT = r"""
final class LeakrayReport {
    /** The run's token, read once and deleted before any untrusted code runs. */
    static byte[] takeToken() throws java.io.IOException {
        java.nio.file.Path p = java.nio.file.Paths.get(System.getProperty("leakray.work"), ".leakray_token");
        byte[] token = java.nio.file.Files.readAllBytes(p);
        java.nio.file.Files.delete(p);
        return token;
    }

    static java.io.FileOutputStream channel(String fd) throws java.io.IOException {
        return new java.io.FileOutputStream("/proc/self/fd/" + fd);
    }

    static void send(java.io.FileOutputStream out, byte[] token, String status) {
        System.out.flush();
        System.err.flush();
        try {
            out.write("LEAKRAY ".getBytes());
            out.write(token);
            out.write((" " + status + "\n").getBytes());
            out.flush();
        } catch (Throwable e) {
            // nothing to do: no line is no pass
        }
        Runtime.getRuntime().halt(0);  // skip shutdown hooks and lingering threads
    }
}
"""

# The SecurityManager's policy (JDK 17-23: `-Djava.security.manager`; removed in JDK 24). The harness
# classes (moved to .h/ after javac) and the JUnit jars may do anything; the program and its tests
# may read the work dir, write under run/ (their cwd), read properties and reflect on declared
# members, and nothing else: no /proc (so no /proc/self/mem, no channel by /proc/self/fd), no
# setAccessible (so no sun.misc.Unsafe, no private fields), no exec, no native code, no class
# loaders, no System.setIO, no shutdown hooks, no SecurityManager changes, no JMX. (`exitVM` Java
# grants the class path itself: an exit ends the run without a verdict, which is never a pass.)
POLICY = """
grant codeBase "file:${leakray.work}/.h/-" { permission java.security.AllPermission; };
grant codeBase "file:/tmp/.junit/-" { permission java.security.AllPermission; };
grant {
    permission java.io.FilePermission "${leakray.work}", "read";
    permission java.io.FilePermission "${leakray.work}/-", "read";
    permission java.io.FilePermission "${leakray.work}/run", "read,write,delete";
    permission java.io.FilePermission "${leakray.work}/run/-", "read,write,delete";
    permission java.util.PropertyPermission "*", "read";
    permission java.lang.RuntimePermission "accessDeclaredMembers";
    permission java.lang.RuntimePermission "getenv.*";
};
"""
def _manifest_class_path(jar: str) -> list[str]:
    try:
        with zipfile.ZipFile(jar) as z:
            text = z.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return []
    text = re.sub(r"\r?\n ", "", text)  # a manifest continues a header on lines that begin with a space
    match = re.search(r"^Class-Path:(.*)$", text, re.M)
    return match.group(1).split() if match else []


def manifest_codebases(jars: list[str], bound_dir: str) -> list[str]:
    """The jars outside `bound_dir` that the JVM also loads through the `Class-Path` of the jars'
    manifests, transitively. Debian's JUnit jars name their dependencies by absolute path
    (/usr/share/java/...), and the class loader searches a jar's manifest entries right after that jar,
    before the rest of -cp: JUnit's classes then come from there, and need the harness's grant there too."""
    out, seen = [], set()
    stack = [(os.path.join(bound_dir, os.path.basename(j)), j) for j in jars]
    while stack:
        seen_as, real = stack.pop()
        for entry in _manifest_class_path(real):
            entry = entry.removeprefix("file:")
            if ":" in entry.split("/", 1)[0]:  # another URL scheme: nothing to load offline
                continue
            target = os.path.normpath(entry if entry.startswith("/") else os.path.join(os.path.dirname(seen_as), entry))
            if target.startswith(bound_dir + "/") or target in seen or not os.path.isfile(target):
                continue  # granted already, or a name the JVM skips because nothing is there
            seen.add(target)
            out.append(target)
            stack.append((target, target))
    return out


def policy(trusted_jars: list[str] = ()) -> str:
    """POLICY, plus AllPermission for each of `trusted_jars` (JUnit's own, by the path the JVM loads it from)."""
    return POLICY + "".join(f'grant codeBase "file:{j}" {{ permission java.security.AllPermission; }};\n'
                            for j in trusted_jars)


HARNESS_CLASSES = ("LeakrayHarness.class", "LeakrayReport.class")  # no nested classes: nothing else to move

# JUnit pinned as one release train; the launcher API is driven by JUNIT_HARNESS, so the console
# launcher jar is not needed. JUnit 4 test classes (NaturalCodeBench's Java tests are a mix) run on the
# vintage engine beside Jupiter, so JUnit 4 and its hamcrest are part of the set; opentest4j and
# apiguardian are the platform's own dependencies. An engine from another train than the platform
# refuses to start, so a set is taken whole or not at all.
JUNIT_ARTIFACTS = (
    ("org/junit/jupiter/junit-jupiter-api", "5.10.2"),
    ("org/junit/jupiter/junit-jupiter-engine", "5.10.2"),
    ("org/junit/jupiter/junit-jupiter-params", "5.10.2"),
    ("org/junit/vintage/junit-vintage-engine", "5.10.2"),
    ("org/junit/platform/junit-platform-commons", "1.10.2"),
    ("org/junit/platform/junit-platform-engine", "1.10.2"),
    ("org/junit/platform/junit-platform-launcher", "1.10.2"),
    ("org/opentest4j/opentest4j", "1.3.0"),
    ("org/apiguardian/apiguardian-api", "1.1.2"),
    ("junit/junit", "4.13.2"),
    ("org/hamcrest/hamcrest-core", "1.3"),
)
# Debian's `junit5` package (which pulls junit4, hamcrest, opentest4j, apiguardian) installs one
# consistent train under /usr/share/java; scripts/install.sh installs it where Maven Central is out of
# reach, as it is for the sandbox's other system dependencies.
DEBIAN_JARS = ("junit-jupiter-api", "junit-jupiter-engine", "junit-jupiter-params", "junit-vintage-engine",
               "junit-platform-commons", "junit-platform-engine", "junit-platform-launcher", "opentest4j",
               "apiguardian-api", "junit4", "hamcrest")
# The Jupiter-only subset of the Maven set: JUnit 5 classes still run where the vintage engine is
# missing, and a JUnit 4 class then fails to compile, saying which imports it lacks.
JUPITER_ONLY = tuple(a for a in JUNIT_ARTIFACTS if "vintage" not in a[0] and a[0] not in (
    "junit/junit", "org/hamcrest/hamcrest-core"))


def _maven_set(repo: str, artifacts) -> list[str] | None:
    jars = []
    for artifact, version in artifacts:
        jar = f"{repo}/{artifact}/{version}/{artifact.rsplit('/', 1)[1]}-{version}.jar"
        if not os.path.isfile(jar):
            return None
        jars.append(jar)
    return jars


def _debian_set(root: str) -> list[str] | None:
    jars = [f"{root}/{name}.jar" for name in DEBIAN_JARS]
    return jars if all(os.path.isfile(j) for j in jars) else None


def junit_jars(configured: str | None = None) -> list[str] | None:
    """The JUnit jars: from config or $LEAKRAY_JUNIT_CLASSPATH; else the pinned set in the local Maven
    repository, Debian's set, or (no vintage engine anywhere) the Jupiter-only Maven set."""
    spec = configured or os.environ.get("LEAKRAY_JUNIT_CLASSPATH")
    if spec:
        jars = [j for part in spec.split(os.pathsep) for j in sorted(glob.glob(part))]
        return jars or None
    repo = os.path.expanduser(os.environ.get("LEAKRAY_M2_REPO", "~/.m2/repository"))
    return (_maven_set(repo, JUNIT_ARTIFACTS) or _debian_set(os.environ.get("LEAKRAY_JAVA_SHARE", "/usr/share/java"))
            or _maven_set(repo, JUPITER_ONLY))


def junit_has_vintage(jars: list[str]) -> bool:
    """Whether JUnit 4 test classes can run on these jars (the vintage engine and JUnit 4's API)."""
    names = [os.path.basename(os.path.realpath(j)) for j in jars]
    return any(n.startswith("junit-vintage-engine") for n in names) and any(
        n.startswith(("junit-4", "junit4")) for n in names)
