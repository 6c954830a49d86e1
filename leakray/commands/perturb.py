"""`leakray perturb --input tasks.jsonl --output variants.jsonl [--kinds IDC,VR] [--seed S] [--check]`.

One output row per task and variant slot (11 per task with every kind): the task's own
columns with the variant's prompt and reference (renamed for VR), plus ``V`` columns; a
slot whose kind cannot apply is a row with ``applicable: false`` and the reason. With
``--check``, each variant's reference runs against the task's tests in the sandbox and the
kept-variant rate per kind and language is printed."""

from __future__ import annotations

import json
import os
import sys


def register(sub) -> None:
    p = sub.add_parser("perturb", help="semantics-preserving prompt variants (AdvPrompt-MIA's 11), JSONL out")
    p.add_argument("--input", required=True,
                   help="tasks JSONL in the task schema, or a benchmark (name, file, or NAME=PATH)")
    p.add_argument("--output", required=True, help="variants JSONL, one row per task and slot")
    p.add_argument("--kinds", default="IDC,IRV,VR,IDP,IDL", help="comma list of kinds (default: all five)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true",
                   help="run every variant's reference against the task's tests in the sandbox")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="sandbox runs at once (--check)")
    p.add_argument("--timeout", type=float, default=20.0, help="wall limit per sandbox run, seconds (--check)")
    p.set_defaults(func=run)


def read_tasks(spec: str) -> list[dict]:
    """A file in leakray's task format (``data/task_file.py``: every row refused with file, row and
    field if it breaks the schema), or anything `leakray benchmarks validate` accepts."""
    from leakray.commands.benchmarks import load_spec

    return load_spec(spec)


def variant_row(task: dict, v, seed: int) -> dict:
    """The output row of one slot: the task with the variant's prompt and reference."""
    from leakray.data.tasks import continuation
    from leakray.schema import V
    from leakray.schema import T

    row = dict(task)
    row.update({V.SLOT: v.slot, V.KIND: v.kind, V.VARIANT: v.index, V.APPLICABLE: v.applicable, V.SEED: seed})
    if v.applicable:
        row[T.PROMPT] = v.prompt
        row[T.REFERENCE] = v.reference(continuation(task[T.PROMPT], task[T.REFERENCE]))
        row.update({V.FORM: v.form, V.REASON: "", V.RENAME: dict(v.rename), V.DETAIL: v.detail})
    else:
        row[T.PROMPT] = row[T.REFERENCE] = None
        row.update({V.FORM: "", V.REASON: v.reason, V.RENAME: {}, V.DETAIL: ""})
    return row


def run(args) -> int:
    from leakray.errors import BadInput
    from leakray.perturb import KINDS, variants_of
    from leakray.schema import V

    kinds = tuple(k.strip().upper() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise BadInput(f"--kinds: unknown {unknown or kinds} (expected some of {','.join(KINDS)})")
    tasks = read_tasks(args.input)
    variants = [variants_of(t, args.seed, kinds) for t in tasks]
    checks = None
    if args.check:
        from leakray.perturb.keep import format_rates, keep_variants, kept_rates
        from leakray.sandbox import Sandbox, SandboxConfig

        checks = keep_variants(tasks, variants, Sandbox(SandboxConfig(timeout_s=args.timeout)),
                               workers=max(1, args.workers))
        print(format_rates(kept_rates(checks)))
    n = 0
    with open(args.output, "w", encoding="utf-8") as out:
        for i, (task, vs) in enumerate(zip(tasks, variants)):
            for j, v in enumerate(vs):
                row = variant_row(task, v, args.seed)
                if checks is not None:
                    row[V.CHECK], row[V.CHECK_DETAIL] = checks[i][j].status, checks[i][j].detail
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += 1
    applicable = sum(v.applicable for vs in variants for v in vs)
    print(f"leakray perturb: {len(tasks)} tasks, {n} slots ({applicable} variants, {n - applicable} not "
          f"applicable) -> {args.output}", file=sys.stderr)
    return 0
