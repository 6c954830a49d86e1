"""Defence for the in-process runners (unittest, pytest), where program and test framework must
share one interpreter: installed by the harness before any untrusted code runs. Stdlib only.

- `PR_SET_DUMPABLE 0`: no other process of the run's uid may ptrace us or open /proc/<pid>/mem|fd.
- Landlock, where the kernel has it: nothing under /proc opens at all, by any path (`hide_proc`).
- A PEP 578 audit hook (irremovable) that refuses, while untrusted code is on the calling
  thread's stack, every route from Python to a frame or to raw memory: `sys._getframe`,
  `sys._current_frames`, `tb_frame`/`gi_frame`/`cr_frame`/`ag_frame`, `sys.settrace`/`setprofile`,
  `sys.addaudithook` (a hook would see our events' arguments), `gc.get_objects/get_referrers/
  get_referents`, every `ctypes.*` operation, opening anything under /proc, creating functions or
  setting `__code__`, installing a Python signal handler (its handler would receive a frame), and
  executing code that claims a trusted file name without being that file's code.
  "Untrusted" is every frame whose code does not come from the interpreter's install (stdlib,
  site-packages) or this package; code cannot fake a trusted file name (see `_code_ok`), and the
  framework's functions keep their code and defaults.
  A few trusted callers that consume frames without handing them on are let through
  (`traceback.clear_frames`, traceback extraction without locals, logging's caller lookup).
- Framework classes are made immutable (`Py_TPFLAGS_IMMUTABLETYPE`, set once through ctypes
  before the program runs): `unittest.TestCase.assertEqual = ...` raises TypeError.

Not covered (see README): code that reads raw memory without ctypes (numpy's
`__array_interface__` with a raw pointer, a C extension the program brings), and objects whose
own `__eq__` lies to an in-process assertion.
"""

import os
import sys
import sysconfig
import threading

PR_SET_DUMPABLE = 4
Py_TPFLAGS_IMMUTABLETYPE = 1 << 8
_FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"))
_ALWAYS = frozenset(("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                     "sys.addaudithook", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                     "function.__new__", "sys._getframemodulename", "sys.monitoring.register_callback",
                     "sys.monitoring.set_events", "sys.monitoring.use_tool_id"))
_FUNC_ATTRS = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
_FRAME_EVENTS = frozenset(("sys._getframe", "sys._current_frames", "object.__getattr__"))


class Refused(ValueError):
    """Raised into untrusted code that asked for something the guard refuses. A ValueError, so that
    stdlib callers that already tolerate a missing frame (namedtuple, typing, enum) still work."""


_CACHE: dict = {}


def trusted_roots() -> list[str]:
    """The interpreter's install (stdlib, site-packages) and this package: where trusted code lives.
    Computed once (the warm zygote does it before forking: sysconfig costs ~6 ms per fresh child)."""
    if "roots" not in _CACHE:
        paths = sysconfig.get_paths()
        roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
        roots |= {p for p in sys.path if p and "-packages" in p}
        roots.add(os.path.dirname(os.path.abspath(__file__)))
        _CACHE["roots"] = sorted({os.path.realpath(r) for r in roots})
    return list(_CACHE["roots"])


def install(work_dir: str, freeze=()) -> None:
    """Lock this interpreter down; call once, before the first untrusted line. `freeze`: names of
    modules (a trailing `.*` takes the package's submodules too) whose classes become immutable."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")
    hide_proc(ctypes, libc)
    exact = {f for f in freeze if not f.endswith(".*")}
    packages = tuple(f[:-1] for f in freeze if f.endswith(".*"))
    _freeze(ctypes, [m for name, m in list(sys.modules.items())
                     if m is not None and (name in exact or name.startswith(packages) or name + "." in packages)])
    work = os.path.realpath(work_dir)
    roots = tuple(r + "/" for r in trusted_roots() if not (work + "/").startswith(r + "/"))
    verdicts: dict = {}
    inside: set = set()
    sinks: set = set()
    verified: dict = {}
    import logging
    import traceback
    import _signal
    sinks.add(traceback.clear_frames.__code__)
    sinks.add(logging.Logger.findCaller.__code__)
    extract = traceback.StackSummary._extract_from_extended_frame_gen.__code__
    getident, realpath, isinstance_, str_, bytes_ = threading.get_ident, os.path.realpath, isinstance, str, bytes
    orig_signal = _signal.signal
    function = type(trusted_roots)
    func_code = function.__code__.__get__
    from importlib.util import cache_from_source
    from marshal import loads as marshal_loads

    def trusted(filename) -> bool:
        ok = verdicts.get(filename)
        if ok is None:
            ok = isinstance_(filename, str_) and (filename.startswith("<frozen ") or (
                filename.startswith("/") and realpath(filename).startswith(roots)
                and not realpath(filename).startswith(work + "/")))
            verdicts[filename] = ok
        return ok

    def untrusted_below(frame) -> object:
        """The first untrusted frame from `frame` outwards (None: all trusted)."""
        while frame is not None:
            if not trusted(frame.f_code.co_filename):
                return frame
            frame = frame.f_back
        return None

    def sink_between(frame, stop) -> bool:
        while frame is not None and frame is not stop:
            code = frame.f_code
            if code in sinks or (code is extract and frame.f_locals.get("capture_locals") is False):
                return True
            frame = frame.f_back
        return False

    def _file_codes(name: str) -> frozenset:
        """Every code object the file `name` really compiles to (its cached bytecode, else its source)."""
        codes = verified.get(name)
        if codes is None:
            top = None
            try:
                with open(cache_from_source(name), "rb") as fh:
                    top = marshal_loads(fh.read()[16:])
            except (OSError, ValueError, EOFError, TypeError, NotImplementedError):
                pass
            try:
                with open(name, "rb") as fh:
                    fresh = compile(fh.read(), name, "exec", dont_inherit=True)
                if top != fresh:  # a stale or planted cache never counts
                    top = fresh
            except (OSError, SyntaxError, ValueError):
                top = None
            found, todo = set(), [top] if top is not None else []
            while todo:
                c = todo.pop()
                found.add(c)
                todo.extend(k for k in c.co_consts if type(k) is type(c))
            codes = verified[name] = frozenset(found)
        return codes

    def _code_ok(code) -> bool:
        """Code that claims a trusted file must be that file's own code (what an import runs): else
        it would run with a trusted name, and the guard would take it for the framework."""
        if type(code) is not type(_code_ok.__code__):
            return True
        name = code.co_filename
        if not trusted(name) or name.startswith("<frozen "):
            return True
        return code in _file_codes(name)

    def refuse(event: str):
        raise Refused(f"leakray sandbox: {event} is not allowed to the program")

    def hook(event, args):
        if event in _ALWAYS or event.startswith("ctypes.") or event in (
                "object.__getattr__", "object.__setattr__", "object.__delattr__", "open", "exec", "leakray.signal"):
            tid = getident()
            if tid in inside:
                return  # our own frame walking raises events too
            inside.add(tid)
            try:
                check(event, args)
            finally:
                inside.discard(tid)

    def check(event, args):
        if event == "object.__getattr__" and args[1] not in _FRAME_ATTRS:
            return
        if event in ("object.__setattr__", "object.__delattr__") and args[1] not in _FUNC_ATTRS:
            return
        code = None  # the code an event would let run
        if event == "exec" or event == "function.__new__":
            code = args[0]
        elif event == "object.__setattr__":
            code = args[2] if len(args) > 2 else None
        if event == "open":
            path = args[0]  # exact copies first: a str subclass's methods are program code
            if isinstance_(path, bytes_):
                path = bytes_.decode(path, "utf-8", "surrogateescape")
            elif isinstance_(path, str_):
                path = str_.__str__(path)
            else:
                return  # an fd
            if not (realpath(path) + "/").startswith("/proc/"):
                return
        if event == "leakray.signal":
            handler = args[1]
            if not callable(handler):
                args[2].append(orig_signal(args[0], handler))
                return
        caller = sys._getframe(2)  # the frame that raised the event (hook <- check <- here)
        bad = untrusted_below(caller)
        if event in ("object.__setattr__", "object.__delattr__"):
            # only the program's own assignments: the stdlib edits its functions too (types.coroutine)
            if trusted(caller.f_code.co_filename):
                return
            if type(args[0]) is function and trusted(func_code(args[0]).co_filename):
                refuse(f"changing {args[1]} of a function of the framework")
            if code is not None and not _code_ok(code):
                refuse(f"setting {args[1]} to code under a trusted file name it does not come from")
            return
        if code is not None:  # compiled from a trusted file, or under an untrusted name: either is honest
            if bad is not None and not _code_ok(code):
                refuse(f"{event} of code under a trusted file name it does not come from")
            return
        if bad is None:
            if event == "leakray.signal":
                args[2].append(orig_signal(args[0], args[1]))
            return
        if event in _FRAME_EVENTS and sink_between(caller, bad):
            return
        refuse(event if event != "object.__getattr__" else f"reading .{args[1]}")

    def signal(signalnum, handler):
        """signal.signal, but a Python handler from untrusted code is refused (it receives a frame)."""
        box = []
        sys.audit("leakray.signal", signalnum, handler, box)
        return box[0]

    sys.addaudithook(hook)
    _signal.signal = signal  # `signal.signal` calls `_signal.signal`; the original lives in the hook only


def hide_proc(ctypes, libc) -> bool:
    """Landlock (Linux >= 5.13), where the kernel has it: from now on this process and its children
    cannot open anything under /proc, whatever the path (a dir fd, `..`, a symlink, /dev/fd). The
    audit hook's path check is the fallback elsewhere. False when Landlock is unavailable."""
    write_file, read_file, read_dir = 1 << 1, 1 << 2, 1 << 3  # LANDLOCK_ACCESS_FS_*
    handled = write_file | read_file | read_dir  # nothing else changes: exec, mkdir, unlink stay as they were

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled)
    ruleset = libc.syscall(444, ctypes.byref(attr), ctypes.sizeof(attr), 0)  # landlock_create_ruleset
    if ruleset < 0:
        return False
    try:
        for name in sorted(os.listdir("/")):
            if name == "proc":
                continue
            try:
                fd = os.open("/" + name, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rights = handled if os.path.isdir("/" + name) else write_file | read_file
                rule = PathBeneath(rights, fd)
                libc.syscall(445, ruleset, 1, ctypes.byref(rule), 0)  # LANDLOCK_RULE_PATH_BENEATH
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required (already set by the sandbox)
            return False
        return libc.syscall(446, ruleset, 0) == 0  # landlock_restrict_self
    finally:
        os.close(ruleset)


def _freeze(ctypes, modules) -> None:
    """Make every class defined in `modules` immutable, as C types are."""
    offset = _CACHE.get("flags_offset")
    for module in modules:
        for value in list(vars(module).values()):
            if not isinstance(value, type) or getattr(value, "__module__", None) != module.__name__:
                continue
            if value.__flags__ & Py_TPFLAGS_IMMUTABLETYPE:
                continue
            if offset is None:
                offset = _CACHE["flags_offset"] = _flags_offset(ctypes, value)
            flags = ctypes.c_ulong.from_address(id(value) + offset)
            if flags.value != value.__flags__:
                raise RuntimeError("tp_flags offset mismatch")
            flags.value |= Py_TPFLAGS_IMMUTABLETYPE


def _flags_offset(ctypes, cls) -> int:
    """Where tp_flags lives in a type object (found, not assumed: it is CPython-version specific)."""
    class Probe:
        pass
    for off in range(8, 400, 8):
        if all(ctypes.c_ulong.from_address(id(c) + off).value == c.__flags__ for c in (cls, Probe, type)):
            return off
    raise RuntimeError("tp_flags not found")
