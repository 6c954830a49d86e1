"""`leakray execute --input rows.jsonl --output results.jsonl [--workers N] [--timeout S] [--allow-weak-isolation]`.

One output line per input id, in completion order. A malformed line becomes an `error` line
naming it; nothing a program does stops the batch; exit 0 whenever the batch completed."""

from __future__ import annotations

import json
import os
import sys


def register(sub) -> None:
    p = sub.add_parser("execute", help="run programs against their tests in the sandbox (JSONL in/out)")
    p.add_argument("--input", required=True, help="JSONL of {id, language, runner?, program, tests, timeout_s?}")
    p.add_argument("--output", required=True, help="JSONL of {id, status, passed, duration_s, stdout_tail, stderr_tail}")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="concurrent runs (default: CPUs)")
    p.add_argument("--timeout", type=float, default=None, help="default wall limit per run, seconds (10)")
    p.add_argument("--allow-weak-isolation", action="store_true",
                   help="run even without bubblewrap (programs then see the host filesystem)")
    p.set_defaults(func=run)


def _requests(path: str, errors: list):
    from leakray.data.io import jsonl_values
    from leakray.schema import X

    seen: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for lineno, req, bad in jsonl_values(fh):
            if bad is not None:
                errors.append((f"line:{lineno}", f"{path}, line {lineno}: not valid JSON ({bad.msg})"))
                continue
            rid = req.get(X.ID) if isinstance(req, dict) else None
            if not isinstance(rid, str) or not rid:
                errors.append((f"line:{lineno}", f"{path}, line {lineno}: field '{X.ID}' must be a non-empty string"))
                continue
            if rid in seen:
                print(f"leakray execute: {path}, line {lineno}: duplicate id {rid!r} ignored", file=sys.stderr)
                continue
            seen.add(rid)
            yield lineno, req


def run(args) -> int:
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from leakray.errors import BadInput
    from leakray.sandbox import Sandbox, SandboxConfig
    from leakray.sandbox.core import error_result

    if not os.path.isfile(args.input):
        print(f"leakray execute: {args.input}: no such file", file=sys.stderr)
        return 2
    if args.timeout is not None and not args.timeout > 0:
        print("leakray execute: --timeout must be positive", file=sys.stderr)
        return 2
    cfg = SandboxConfig(allow_weak_isolation=args.allow_weak_isolation)
    if args.timeout is not None:
        cfg.timeout_s = args.timeout
    try:
        sandbox = Sandbox(cfg)
    except BadInput as exc:
        print(f"leakray execute: {exc}", file=sys.stderr)
        return 2
    workers = max(1, args.workers)
    errors: list = []
    done = 0
    with open(args.output, "w", encoding="utf-8") as out, ThreadPoolExecutor(workers) as pool:
        def emit(result: dict) -> None:
            nonlocal done
            out.write(json.dumps(result, ensure_ascii=False) + "\n")
            out.flush()
            done += 1

        def run_one(lineno: int, req: dict) -> dict:
            result = sandbox.run(req)
            if result["status"] == "error" and result["stderr_tail"].startswith("bad request"):
                result["stderr_tail"] = f"{args.input}, line {lineno}: {result['stderr_tail']}"
            return result

        pending: set = set()
        for lineno, req in _requests(args.input, errors):
            while errors:
                emit(error_result(*errors.pop(0), harness_error="BadRequest"))
            pending.add(pool.submit(run_one, lineno, req))
            if len(pending) >= 4 * workers:  # bounded memory for a million rows
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    emit(f.result())
        for f in pending:
            emit(f.result())
        for rid, msg in errors:
            emit(error_result(rid, msg, harness_error="BadRequest"))
    print(f"leakray execute: {done} results -> {args.output} (isolation: {sandbox.isolation})", file=sys.stderr)
    return 0
