"""`spec_for`: the smallest valid `SweepSpec` with the few numbers a hand-made report is judged by (batch
sizes, optimizers, tolerance, lr range, seeds and looks, seq_len), for tests that build reports from
results they made up (`sweeps.analysis.build_report(results, spec=...)`).

What the analysis does not read is the spec's default, or the least that validates: one search trial per
cell (the trial cap never binds), a token budget of one whole step of every batch size."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.batch_axis import lattice
from sweeps.spec import BatchSearchSpec, SweepSpec


def spec_for(
    *,
    name: str = "test",
    batch_sizes: Sequence[int] | Mapping[str, Any] = (16, 32),
    optimizers: Sequence[str] = ("adamw",),
    baseline: str | None = None,
    tolerance: float = 0.01,
    lr: tuple[float, float] = (1e-4, 1e-1),
    lr_extend: float = 1.0,
    seeds: int = 2,
    looks: int = 1,
    seq_len: int = 32,
    token_budget: int | None = None,
    **fields: Any,
) -> SweepSpec:
    """A validated spec. `batch_sizes`: a list, or a search of the batch axis ({min, max, ...}).
    `baseline`: None is the first optimizer. `lr_extend` 1: a best lr is judged at the edge against
    [lr_min, lr_max] themselves. `looks` > 1: adaptive seeds from `seeds` up by one per look (`seeds` >= 2),
    so that each noise check splits its 5% over `looks`. `token_budget` None: lcm(lattice) x seq_len
    tokens, one step at the largest batch size. `fields`: any other of the spec's fields, as its mapping
    (`schedule={"warmup_tokens": 256}`). Specs are cached by their mapping: equal numbers, the same spec
    (frozen)."""
    sizes = list(batch_sizes) if not isinstance(batch_sizes, Mapping) else dict(batch_sizes)
    if token_budget is None:
        token_budget = math.lcm(*_lattice_of(sizes)) * seq_len
    mapping = {
        "name": name,
        "model": {"seq_len": seq_len},
        "optimizers": [{"name": o} for o in optimizers],
        "batch_sizes": sizes,
        "token_budget": token_budget,
        "lr": {"min": lr[0], "max": lr[1], "extend": lr_extend, "trials_per_batch_size": 1},
        "seeds": seeds if looks == 1 else {"min": seeds, "max": seeds + looks - 1, "step": 1},
        "degradation": {"tolerance": tolerance, "baseline": baseline if baseline is not None else optimizers[0]},
        **fields,
    }
    return _validated(json.dumps(mapping, sort_keys=True))


def _lattice_of(sizes: list[int] | dict[str, Any]) -> list[int]:
    """The batch sizes a spec with these `batch_sizes` (one worker per trial) may train."""
    if isinstance(sizes, list):
        return sizes
    resolution = sizes.get("resolution", BatchSearchSpec.model_fields["resolution"].default)
    return lattice(sizes["min"], sizes["max"], resolution, 1)


@functools.lru_cache(maxsize=256)
def _validated(document: str) -> SweepSpec:
    # one validation per distinct spec (~1 ms each): the simulations build thousands of reports
    return SweepSpec.from_mapping(json.loads(document))
