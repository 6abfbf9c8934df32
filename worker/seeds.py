"""Every random draw of a trial comes from a stream keyed on the trial's seed: nothing depends on what
ran before it in the same process (Ray Tune's `reuse_actors`, a test session, a notebook).

    model init     build_model: torch.manual_seed(seed) inside fork_rng (worker/model.py)
    data order     TrainBatches: numpy Generator([seed, epoch]) (worker/data.py)
    dropout        the global torch RNG, re-seeded at every step from (seed, DROPOUT, rank, step), so a
                   resumed run draws the masks an uninterrupted one would
    Sophia labels  a torch.Generator seeded from (seed, SOPHIA_LABELS, step) at every Hessian pass
                   (one draw for the global batch, each rank taking its rows: the labels do not depend
                   on micro-batch size or worker count)

Streams are told apart by a fixed integer per purpose (never Python's salted `hash`), mixed with the
seed and the keys by numpy's SeedSequence.
"""

from __future__ import annotations

import numpy as np

# one integer per stream: fixed forever (changing one changes every run's numbers)
DROPOUT = 1
SOPHIA_LABELS = 2


def derived_seed(seed: int, stream: int, *keys: int) -> int:
    """A 63-bit seed for `stream` of the trial with `seed`, at `keys` (rank, step, ...): a pure function.

    SeedSequence wants non-negative entropy; the modulo keeps negative seeds usable and distinct (as in
    TrainBatches). 63 bits: torch.manual_seed and torch.Generator.manual_seed take any int64 >= 0.
    """
    entropy = [seed % 2**64, stream, *(k % 2**64 for k in keys)]
    (state,) = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)
    return int(state) >> 1
