"""How much of a model's benchmark score is memory: pass@1 on flagged vs clean samples.

LessLeak-Bench measured StarCoder-7B solving leaked APPS problems 4.9x as often as the
rest. Per task pass@1 is the unbiased estimate from k samples (c / k); the ratio's 95%
interval resamples tasks within each side (flagged, clean), a near-copy group as one task."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.schema import C


def _ratio(a: float, b: float) -> float | None:
    return None if b <= 0 else a / b


def inflation(pass1, flagged, *, n_boot: int = 1000, seed: int = 0, groups=None) -> dict:
    """``pass1``: per-task pass@1 (NaN where the task has no tests); ``flagged``: bool per task;
    ``groups``: one label per task (a benchmark's near-copies share one, `resample.group_index`),
    each group's tasks on one side drawn whole by the bootstrap."""
    from leakray.evaluate.resample import task_resamples

    p = np.asarray(pass1, dtype=np.float64)
    f = np.asarray(flagged, dtype=bool)
    ok = np.isfinite(p)
    pf, pc = p[ok & f], p[ok & ~f]
    g = np.arange(len(p)) if groups is None else np.asarray(groups)
    gf, gc = g[ok & f], g[ok & ~f]
    out = {"n_flagged": int(f.sum()), "n_clean": int((~f).sum()), "n_tested": int(ok.sum()),
           "score_all": float(p[ok].mean()) if ok.any() else None,
           "score_clean": float(pc.mean()) if len(pc) else None,
           "pass1_flagged": float(pf.mean()) if len(pf) else None,
           "pass1_clean": float(pc.mean()) if len(pc) else None, "ratio": None, "ratio_ci": None,
           "difference": None, "difference_ci": None}
    if not len(pf) or not len(pc):
        out["why"] = "no flagged samples" if not len(pf) else "no clean samples"
        return out
    out["difference"] = out["pass1_flagged"] - out["pass1_clean"]
    out["ratio"] = _ratio(out["pass1_flagged"], out["pass1_clean"])
    rng = np.random.default_rng(seed)
    diffs, ratios = [], []
    for _ in range(int(n_boot)):  # without groups: rng.choice(pf, len(pf)), then pc's, as before
        a, b = pf[task_resamples(gf, 1, rng)[0]].mean(), pc[task_resamples(gc, 1, rng)[0]].mean()
        diffs.append(a - b)
        ratios.append(_ratio(a, b))
    if n_boot:
        out["difference_ci"] = np.percentile(diffs, [2.5, 97.5]).tolist()
        finite = [r for r in ratios if r is not None]
        if len(finite) >= 0.975 * len(ratios):  # an interval only where almost no resample hits a clean score of 0
            out["ratio_ci"] = np.percentile(finite, [2.5, 97.5]).tolist()
    if out["ratio"] is None:
        out["why"] = "clean pass@1 is 0: the ratio is unbounded; the difference is reported"
    return out


def pass_at_1(table: pa.Table) -> np.ndarray:
    """Per task: passed samples / k (NaN where the task has no tests)."""
    passed = table.column(C.PASSED).to_pylist()
    tested = table.column(C.HAS_TESTS).to_pylist()
    return np.array([np.mean(p) if t and p else np.nan for p, t in zip(passed, tested)], dtype=np.float64)
