"""Rebuild a local model from scratch and compare it with the prebuilt copy the package ships
(`leakray/prebuilt/base/` for `tiny`, `leakray/prebuilt/tiny-alt/`; see `leakray.models.prebuilt`).

    python scripts/build_base.py --check [--model tiny-alt]   # train into a temp dir, compare every file's sha256
    python scripts/build_base.py --update [--model tiny-alt]  # train, and make the result the shipped copy

Training is `leakray.models.offline.pretrain(cfg)` with the default config's `model.tiny` (or
`model.shadow_tiny` for tiny-alt), exactly what `ensure_base_model` runs for a config no copy ships
for. Bit for bit only on the build's corpus (its Python's standard library) and torch: elsewhere
`--check` says so before training.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="rebuild and compare with the shipped copy")
    mode.add_argument("--update", action="store_true", help="rebuild and replace the shipped copy")
    ap.add_argument("--model", choices=("tiny", "tiny-alt"), default="tiny")
    ap.add_argument("--keep", type=Path, default=None, help="build here instead of a temp dir (and keep it)")
    args = ap.parse_args()

    from leakray.config import SimulateConfig, load_config, to_stage
    from leakray.models import prebuilt
    from leakray.models.offline import pretrain, stdlib_sources

    models = load_config([], [], SimulateConfig).model  # the packaged defaults: what a run asks for
    cfg = to_stage(models.tiny if args.model == "tiny" else models.shadow_tiny)
    where = prebuilt.FOLDERS[args.model]
    corpus = stdlib_sources(int(cfg.corpus_mb * 1e6))
    ok, why = prebuilt.reproducible_here(cfg, corpus, where)
    if args.check and not ok:  # minutes of training whose bytes could not be compared
        print(f"not comparable here: {why}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp) / args.model
        t0 = time.perf_counter()
        stats = pretrain(cfg, out, progress=True)
        print(f"built in {time.perf_counter() - t0:.0f} s: {stats['steps']} steps, val loss {stats['val_loss']}")
        if stats["stopped_by_time_cap"]:
            print("the build hit its time cap before max_steps: not the shipped model", file=sys.stderr)
            return 1
        if args.update:
            doc = prebuilt.write(cfg, corpus, out, where)
            print(json.dumps(doc["key"], indent=2))
            return 0
        same = prebuilt.compare(out, where)
        for name, equal in same.items():
            print(f"{name:<26} {'identical' if equal else 'DIFFERS'}")
        return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
