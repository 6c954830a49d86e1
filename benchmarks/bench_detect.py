"""The detect stage's work, detector by detector, before and after its speed-ups, in one process.

    python benchmarks/bench_detect.py RUN_DIR [--seeds 5] [--only cgmia,advprompt,...]

RUN_DIR is a demo run (``runs/humaneval-<hash>``: its collect_shadow and collect_target
collections). Every detector's fit + threshold + target scoring for all seeds (what the stage
runs per detector) is timed in CPU seconds of this process, torch on one thread (a Ray worker's
setting), so a busy machine does not distort it:

- each learned detector with torch's for-loop Adam (before) and the fused kernel (after:
  ``leakray.models.kernels.adam``), and their ratio;
- cgmia + cgmia_ensemble fitted one after the other, each its own fits (before: 5 + 15 CGMIA
  seeds at 3 members), against one group fit where the ensemble reuses CGMIA's fits (after: 7).

With ``--memory``: every detector (``--only``, default all that the collections allow) with
tracemalloc's per-detector trace on and off (``detect.trace_memory``), side by side, and the CPU
ratio; the resident-set peak (``peak_rss_mb``, sampled by a thread) is taken in both.

With ``--rss``: every detector group with the resident-set peak read from the kernel's
high-water mark (the default, ``leakray.protocols.rss_peak``) and from a thread sampling it at
100 Hz (before), side by side after a warm-up run of each group, with the CPU ratio and both peaks.

With ``--advprompt``: the detect stage's two AdvPrompt-MIA parts beside the registry's detectors
(the gray-box setting over the seeds; RQ2's ablation: 1 + 5 kinds + 27 features = 33 fits at
seed 0), CPU seconds each; then whether training several of AdvPrompt's classifiers as one
stacked model (one batched matrix product per layer, one fused Adam step for all) would make
those fits cheaper: K fits of the real ``advprompt.fit`` on the shadow collection one after
another, against K same-shaped MLPs (same layers, dropout, batches of 4, epochs, fused Adam)
stacked, per fit.

With ``--composites``: each composite (``leakray_combined``, ``text_combined``) fitted and scored
for every seed the way the stage ran it before (each seed its own task: the tables arrive as new
objects, so every seed builds the inputs again) and the way it runs now (every seed in one task,
the inputs built once per collection: ``leakray.detect.arrays.per_table``), CPU seconds and their
ratio; then the composites' per-column AUCs on the demo's input matrix, sklearn's
``roc_auc_score`` column by column (before) against ``evaluate.metrics.column_auc`` (after).

The stage's wall time on the demo (Ray tasks, Ray Train and Tune side by side) is in the
demo's marker; this script shows where the core-seconds went.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def _collections(run_dir: Path):
    """The run's shadow and target collections; torch on one thread (a Ray worker's setting)."""
    import pyarrow.parquet as pq
    import torch

    torch.set_num_threads(1)
    return tuple(pq.read_table(run_dir / f"collect_{role}" / "collection.parquet") for role in ("shadow", "target"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--only", default=None,
                    help="detectors (default: the learned ones; with --memory every one the collections allow)")
    ap.add_argument("--memory", action="store_true", help="tracemalloc on against off, per detector")
    ap.add_argument("--rss", action="store_true", help="the high-water mark against a sampling thread, per detector")
    ap.add_argument("--advprompt", action="store_true",
                    help="AdvPrompt's gray-box and ablation parts, and its fits one by one against stacked")
    ap.add_argument("--composites", action="store_true",
                    help="the composites' seeds one task each (inputs rebuilt) against together; AUCs per column")
    args = ap.parse_args()
    if args.composites:
        return composites(args)
    if args.advprompt:
        return advprompt(args)
    if args.memory:
        return memory(args)
    if args.rss:
        return rss(args)
    args.only = args.only or "advprompt,cgmia,cnn,lstm,transformer,leakray_combined,text_combined,gotcha"

    import torch

    import leakray.detect.advprompt
    import leakray.detect.cgmia
    import leakray.detect.sequence
    from leakray.detect import registry
    from leakray.detect.base import FitContext
    from leakray.protocols.detectors import fit_and_score

    shadow, target = _collections(args.run_dir)  # torch on one thread from here
    seeds = list(range(args.seeds))
    ctx = FitContext()
    boot = {"n_bootstrap": 0, "bootstrap_seed": 0}
    users = (leakray.detect.advprompt, leakray.detect.cgmia, leakray.detect.sequence)  # who trains with adam
    fused = leakray.detect.cgmia.adam

    def use(adam) -> None:
        for module in users:
            module.adam = adam

    def loop_adam(params, **kw):  # the for-loop implementation: torch's CPU default
        return torch.optim.Adam(params, **kw)

    def run(members: list[str]) -> float:
        return cpu(lambda: fit_and_score((members, seeds), shadow, target, {}, ctx, False, boot))[1]

    print(f"{shadow.num_rows} shadow rows, {target.num_rows} target rows, seeds {seeds}; CPU seconds, one thread")
    print(f"{'detector':<22}{'for-loop Adam':>15}{'fused Adam':>12}{'ratio':>8}")
    total = [0.0, 0.0]
    for name in args.only.split(","):
        registry.detector_class(name)
        use(loop_adam)
        before = run([name])
        use(fused)
        after = run([name])
        total[0] += before
        total[1] += after
        print(f"{name:<22}{before:>15.1f}{after:>12.1f}{after / before:>8.2f}")
    print(f"{'total':<22}{total[0]:>15.1f}{total[1]:>12.1f}{total[1] / total[0]:>8.2f}")

    apart = run(["cgmia"]) + run(["cgmia_ensemble"])
    together = run(["cgmia", "cgmia_ensemble"])
    print(f"\ncgmia + cgmia_ensemble (fused Adam): apart {apart:.1f} s, one group {together:.1f} s, "
          f"ratio {together / apart:.2f}")


def advprompt(args) -> None:
    import torch

    from leakray.detect import advprompt as ap
    from leakray.protocols.advprompt_eval import advprompt_part

    shadow, target = _collections(args.run_dir)  # torch on one thread from here
    seeds = list(range(args.seeds))
    print(f"{shadow.num_rows} shadow rows, {target.num_rows} target rows, seeds {seeds}; CPU seconds, one thread")
    for part in ("graybox", "ablation"):
        out, spent = cpu(lambda: advprompt_part(part, shadow, target, seeds, "shadow_max_mcc", 1000))
        print(f"AdvPrompt {part:<9}{spent:>8.1f}" + (f"  (skipped: {out['skipped']})" if "skipped" in out else ""))

    cfg = ap.AdvPromptConfig()
    arrays = ap.arrays_from_table(shadow)
    x = torch.as_tensor(ap.fit(arrays, cfg, 0).inputs(arrays))  # the real inputs [n, 27]
    y = torch.as_tensor(arrays["member"].astype("int64"))
    print(f"\nfits of AdvPrompt's classifier ({x.shape[1]}-{'-'.join(map(str, cfg.hidden))}-2, {cfg.epochs} epochs, "
          f"batches of {cfg.batch_size}, fused Adam), CPU seconds per fit")
    print(f"{'K fits':<8}{'one by one':>12}{'stacked':>10}{'ratio':>8}")
    for k in (1, 4, 8, 33):
        one = cpu(lambda: [ap.fit(arrays, cfg, s) for s in range(k)])[1] / k
        stacked = cpu(lambda: _stacked_fits(x, y, k, cfg))[1] / k
        print(f"{k:<8}{one:>12.2f}{stacked:>10.2f}{stacked / one:>8.2f}")


def composites(args) -> None:
    import numpy as np
    import pyarrow as pa
    from sklearn.metrics import roc_auc_score

    from leakray.detect import registry
    from leakray.detect.base import FitContext, labels
    from leakray.evaluate.metrics import column_auc
    from leakray.protocols.detectors import fit_and_score

    shadow, target = _collections(args.run_dir)
    seeds = list(range(args.seeds))
    boot = {"n_bootstrap": 0, "bootstrap_seed": 0}
    anew = lambda t: pa.Table.from_batches(t.to_batches(), t.schema)  # noqa: E731  (what a Ray task receives)
    print(f"{shadow.num_rows} shadow rows, {target.num_rows} target rows, seeds {seeds}; CPU seconds, one thread")
    print(f"{'composite':<18}{'a task per seed':>16}{'seeds together':>16}{'ratio':>8}")
    registry.make("leakray_combined").features(anew(shadow))  # warm-up: the imports its inputs need
    for name in ("leakray_combined", "text_combined"):
        apart = cpu(lambda: [fit_and_score(([name], [s]), anew(shadow), anew(target), {}, FitContext(), False, boot)
                             for s in seeds])
        together = cpu(lambda: fit_and_score(([name], seeds), anew(shadow), anew(target), {}, FitContext(), False,
                                             boot))
        same = all(np.array_equal(a["rows"][name][0]["score"], b["score"])
                   for a, b in zip(apart[0], together[0]["rows"][name]))
        print(f"{name:<18}{apart[1]:>16.2f}{together[1]:>16.2f}{together[1] / apart[1]:>8.2f}"
              f"  (the same scores: {same})")
    x, _ = registry.make("leakray_combined").features(shadow)
    y = labels(shadow)
    x = x[:, x.std(0) > 0]
    reps = 20
    before = cpu(lambda: [[roc_auc_score(y, x[:, j]) for j in range(x.shape[1])] for _ in range(reps)])[1] / reps
    after = cpu(lambda: [column_auc(y, x) for _ in range(reps)])[1] / reps
    gap = np.abs(column_auc(y, x) - [roc_auc_score(y, x[:, j]) for j in range(x.shape[1])]).max()
    print(f"\nAUC of each of {x.shape[1]} inputs on {len(y)} rows: sklearn column by column {1000 * before:.1f} ms, "
          f"column_auc {1000 * after:.2f} ms, ratio {after / before:.3f} (largest difference {gap:.1e})")


def _stacked_fits(x, y, k: int, cfg) -> None:
    """``k`` MLPs shaped like AdvPrompt's, trained at once: weights [k, in, out], one batched
    matrix product per layer, one fused Adam step over all of them; each its own row order."""
    import torch
    import torch.nn.functional as F

    from leakray.models.kernels import adam

    torch.manual_seed(0)
    dims = [x.shape[1], *cfg.hidden, 2]
    weights = [(torch.randn(k, a, b) / a ** 0.5).requires_grad_() for a, b in zip(dims[:-1], dims[1:])]
    biases = [torch.zeros(k, 1, b, requires_grad=True) for b in dims[1:]]
    opt = adam(weights + biases, lr=cfg.lr)
    n = len(y)
    for _ in range(cfg.epochs):
        order = torch.stack([torch.randperm(n) for _ in range(k)])
        for s in range(0, n, cfg.batch_size):
            idx = order[:, s:s + cfg.batch_size]
            h = x[idx]
            for i, (w, b) in enumerate(zip(weights, biases)):
                h = torch.baddbmm(b, h, w)
                if i < len(weights) - 1:
                    h = F.dropout(F.relu(h), cfg.dropout)
            # the sum of each model's mean loss: every model gets its own gradient
            loss = F.cross_entropy(h.reshape(-1, 2), y[idx].reshape(-1), reduction="sum") / idx.shape[1]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def _groups(args, shadow, target) -> dict[str, list[str]]:
    from leakray.detect import registry
    from leakray.detect.base import missing_input

    names = args.only.split(",") if args.only else [
        n for n in registry.resolve("all")
        if not (missing_input(shadow, registry.spec(n).columns) or missing_input(target, registry.spec(n).columns))]
    groups: dict[str, list[str]] = {}  # as the stage fits them: a group's detectors in one call
    for n in names:
        groups.setdefault(registry.detector_class(n).group or n, []).append(n)
    return groups


def _side_by_side(args, columns: tuple[str, str], run, peaks: tuple[tuple[str, str, str], ...],
                  warm_up: bool = False) -> None:
    """Each detector group (fit + threshold + scoring, every seed, one process, torch on one
    thread) run two ways, ``run(fit, which)`` with which 0 then 1 around the stage's
    ``fit_and_score``; prints both CPU times, their ratio and the ``peaks`` columns
    (header, which side's cost, cost key)."""
    from leakray.detect.base import FitContext
    from leakray.protocols.detectors import fit_and_score

    shadow, target = _collections(args.run_dir)  # torch on one thread from here
    seeds, ctx, boot = list(range(args.seeds)), FitContext(), {"n_bootstrap": 0, "bootstrap_seed": 0}
    print(f"{shadow.num_rows} shadow rows, {target.num_rows} target rows, seeds {seeds}; CPU seconds, one thread")
    print(f"{'detector group':<34}{columns[0]:>10}{columns[1]:>10}{'ratio':>7}"
          + "".join(f"{h:>{len(h) + 3}}" for h, _, _ in peaks))
    total = [0.0, 0.0]
    for members in _groups(args, shadow, target).values():
        def fit(trace: bool = False, members=members):
            return cpu(lambda: fit_and_score((members, seeds), shadow, target, {}, ctx, trace, boot))

        if warm_up:
            run(fit, 1)  # lazy imports and the allocator's first growth go to neither side
        (a, t_a), (b, t_b) = run(fit, 0), run(fit, 1)
        if "skipped" in a:
            print(f"{','.join(members)[:33]:<34} skipped: {a['skipped']}")
            continue
        total[0] += t_a
        total[1] += t_b
        print(f"{','.join(members)[:33]:<34}{t_a:>10.1f}{t_b:>10.1f}{t_b / max(t_a, 1e-9):>7.2f}"
              + "".join(f"{((a, b)[side == 'b']['cost'][key] or 0):>{len(h) + 3}.1f}" for h, side, key in peaks))
    print(f"{'total':<34}{total[0]:>10.1f}{total[1]:>10.1f}{total[1] / total[0]:>7.2f}")


def rss(args) -> None:
    """The resident-set peak read from a 100 Hz sampling thread (before) and from the kernel's
    high-water mark (after), after a warm-up run of each group: CPU seconds (the process's
    every thread counted) and both peaks."""
    from leakray.protocols import rss_peak

    def run(fit, which: int):
        rss_peak.USE_MARK = bool(which)
        try:
            return fit()
        finally:
            rss_peak.USE_MARK = True

    _side_by_side(args, ("sampled", "mark"), run,
                  (("peak MB sampled", "a", "peak_rss_mb"), ("peak MB mark", "b", "peak_rss_mb")), warm_up=True)


def memory(args) -> None:
    """detect.trace_memory off and on: CPU seconds, the resident-set peak untraced and
    tracemalloc's peak traced."""
    _side_by_side(args, ("untraced", "traced"), lambda fit, which: fit(trace=bool(which)),
                  (("peak RSS MB", "a", "peak_rss_mb"), ("py peak MB", "b", "py_peak_mb")))


if __name__ == "__main__":
    main()
