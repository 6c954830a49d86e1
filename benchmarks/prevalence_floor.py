"""How narrow can a leaked-fraction interval be? The Cramér–Rao floor for the mixture weight.

An audit estimates π, the share of a benchmark's n tasks that leaked, from one score per task.
Even an estimator that knew both score distributions exactly — clean tasks N(0, 1), members
N(d, 1) with d set by the members' AUC, d = √2 Φ⁻¹(AUC) — cannot beat the Fisher information of
π: Var ≥ 1 / (n ∫ (f1 − f0)² / ((1 − π) f0 + π f1)). Every route here knows less (the member
distribution is never known, the null only estimated), so its intervals are wider than this.

    python benchmarks/prevalence_floor.py                       # the table in docs/AUDIT.md
    python benchmarks/prevalence_floor.py --auc 0.9 --n 164 --share 0.25
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import integrate, stats


def floor_width(auc: float, n: int, share: float) -> float:
    """The narrowest 95% interval (2 × 1.96 sd) any unbiased estimator of the share can give."""
    d = np.sqrt(2.0) * stats.norm.ppf(auc)

    def integrand(x: float) -> float:
        f0, f1 = stats.norm.pdf(x), stats.norm.pdf(x, d)
        return (f1 - f0) ** 2 / ((1 - share) * f0 + share * f1)

    info = n * integrate.quad(integrand, -12.0, d + 12.0)[0]
    return float(2 * 1.96 / np.sqrt(info))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--auc", type=float, nargs="*", default=[0.66, 0.8, 0.9, 0.95, 0.99])
    ap.add_argument("--n", type=int, nargs="*", default=[109, 164, 500, 1000])
    ap.add_argument("--share", type=float, default=0.25)
    args = ap.parse_args()
    print(f"narrowest 95% interval of a {args.share:.0%} leaked share (both score distributions known)\n")
    print("| members' AUC | " + " | ".join(f"n = {n}" for n in args.n) + " |")
    print("|---|" + "---|" * len(args.n))
    for auc in args.auc:
        print(f"| {auc:.2f} | " + " | ".join(f"{floor_width(auc, n, args.share):.2f}" for n in args.n) + " |")


if __name__ == "__main__":
    main()
