"""How often the critical-batch law's intervals hold the truth (`sweeps.law`), on laws drawn at random.

Each problem: a true law B*(D) = a (D / 1e8)^b with b uniform in [0.3, 0.7] and a in [16, 128] sequences,
each scale's B* scattered about it by `--scatter` (sd in ln B*), swept at 5 token budgets over two decades
(1e7 .. 1e9) on a lattice of powers of 2, so each scale's bracket is [2^k, 2^(k+1)). The law is fitted to the
brackets and asked for B* at 4.8e10 tokens (the paper's 48B, 48x past the largest budget swept).

Prints the share of problems whose 95% prediction interval holds the target's B* (a fresh draw of the
scatter), whose exponent interval holds b, and whose leave-largest-out check holds (the point predicted for
the largest scale inside its own bracket); the last line the prediction interval's coverage against its 0.95.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from sweeps.law import BatchLaw, LeaveOneOut, Scale, fit_batch_law, leave_largest_out

BUDGETS = (1e7, 3e7, 1e8, 3e8, 1e9)
TARGET = 4.8e10


def bracket(b: float) -> tuple[int, int]:
    k = math.floor(math.log2(b))
    return 2**k, 2 ** (k + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--scatter", type=float, default=0.15, help="sd of ln B* about the law")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    predicted, exponent, loo, refused = 0, 0, 0, 0
    for _ in range(args.problems):
        b, a = rng.uniform(0.3, 0.7), rng.uniform(16, 128)

        def truth(d: float, a: float = a, b: float = b) -> float:
            return a * (d / 1e8) ** b * math.exp(rng.normal(0, args.scatter))

        scales = [Scale(d, *bracket(truth(d))) for d in BUDGETS]
        law = fit_batch_law(scales)
        if not isinstance(law, BatchLaw):
            refused += 1
            continue
        pred = law.predict(TARGET)
        predicted += pred.low < truth(TARGET) < pred.high
        exponent += law.tokens_interval[0] < b < law.tokens_interval[1]
        check = leave_largest_out(scales)
        loo += isinstance(check, LeaveOneOut) and check.held
    n = args.problems
    print(
        f"{n} laws, scatter {args.scatter} in ln B*, 5 budgets 1e7..1e9 on powers of 2, target {TARGET:.1e} tokens "
        f"({time.perf_counter() - started:.0f} s): exponent interval holds b {exponent / n:.2f}, leave-largest-out "
        f"holds {loo / n:.2f}, refused {refused}"
    )
    print(f"prediction interval holds the target's B* {predicted / n:.2f} (target 0.95)")


if __name__ == "__main__":
    main()
