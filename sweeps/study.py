"""A study: one sweep spec run at several scales (model presets x token budgets) to fit the critical batch size
as a law (`sweeps.law`) and predict it at a target scale nobody sweeps; and what it costs next to the sweep at
the target it replaces.

A study file is a sweep spec without `model` and `token_budget`, plus `scales` and `target`:

    name: merit-law
    scales: {models: [{preset: gpt2-small, seq_len: 1024}], token_budgets: [1.5e9, 3.0e9]}   # the product
    # or a list of pairs:  scales: [{model: {...}, token_budget: 1.5e9}, ...]
    target: {model: {preset: gpt2-medium, seq_len: 1024}, token_budget: 4.8e10}
    optimizers: ...                                   # every other field of a sweep spec, as in one

Each scale's sweep is the sweep spec with that scale's model and token budget (validated as a sweep is, its
errors naming the scale), named `<name>-s<i>`, smallest first (by parameters x tokens: the order a study runs
them, so that each can start from what the smaller ones imply).

Transfer (`transfer: true`, the default): a scale whose sweep searches the batch axis starts, after its
reference, at the size the smaller scales predict for each optimizer (`batch_sizes.start`, `transferred`):
with two or more scales behind it, the batch law fitted to their brackets (`sweeps.law`) at this scale; with
one, that scale's largest size decided fine (the critical batch does not shrink with more tokens).

A larger budget's search reaches higher (`grow_batch_axis: true`, the default; `_grown`): its `batch_sizes.max`
is max x (its tokens / the smallest scale's), the most a critical batch growing no faster than the data can
need, as far as a sweep's rules allow and with its tokens trained whole; the sizes below are the same at every
scale. A listed `batch_sizes` is trained as listed.

Each scale's search of the batch axis decides its bracket's ends, not only its answer (`batch_sizes.decide_ends`,
set here unless the file gives it): the law is fitted from the brackets.

Predict, then confirm (`confirm: true`): after the law, one more sweep at the target trains the reference and,
per optimizer, the lattice's sizes on each side of the predicted B* (`confirm_spec`): a handful of cells where
the target's sweep would list them all; its bracket then says whether the prediction held
(`sweeps.law.confirm_laws`), and its best lrs stand beside the lr law's. That sweep comes from the fitted law,
so before anything runs it is priced at its bound (`confirm_bound_spec`: what a confirmation from one law per
optimizer can cost at most), the `confirmation` of `price_study`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sweeps.cost import FloatRange, PriceConfig, SweepCost, evaluations_per_trial, price
from sweeps.spec import SweepSpec
from worker.config import MAX_BATCH_SIZE, DataConfig, ModelConfig

if TYPE_CHECKING:
    from sweeps.law import OptimizerLaw
    from sweeps.report import Report

__all__ = [
    "MAX_SCALES",
    "StudyCost",
    "StudyScale",
    "StudySpec",
    "SweepPrice",
    "confirm_bound_spec",
    "confirm_spec",
    "fit_laws",
    "is_study",
    "law_params",
    "price_study",
    "sweep_prices",
    "transferred",
]

MAX_SCALES = 24  # sweeps in one study


class StudyScale(BaseModel):
    """One scale: a model and a token budget (tokens per trial)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelConfig
    token_budget: int = Field(gt=0)


class StudyGrid(BaseModel):
    """Scales as the product of models and token budgets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[ModelConfig] = Field(min_length=1)
    token_budgets: list[int] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _whole_budgets(cls, data: Any) -> Any:
        # YAML reads 1.5e9 as a float: whole numbers of tokens are taken as the ints they are
        if isinstance(data, dict) and isinstance(data.get("token_budgets"), list):
            data = dict(data, token_budgets=[_whole(v) for v in data["token_budgets"]])
        return data


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


class StudySpec(BaseModel):
    """A study (module docstring); `sweep`: every field of a sweep spec but `name`, `model` and `token_budget`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    scales: list[StudyScale] | StudyGrid
    target: StudyScale
    sweep: dict[str, Any]
    transfer: bool = True  # each scale's batch-axis search starts where the smaller scales predict
    # after the law, one sweep at the target trains only the reference and the sizes on each side of each
    # predicted B* (`confirm_spec`), and says whether the prediction held (`sweeps.law.confirm_laws`)
    confirm: bool = False
    # a search's batch axis reaches higher at a larger budget (`_grown`): max x (tokens / the smallest scale's)
    grow_batch_axis: bool = True

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        """The file's flat form: the sweep fields beside `name`, `scales` and `target`."""
        if not isinstance(data, dict) or "sweep" in data:
            return data
        own = {"name", "scales", "target", "transfer", "confirm", "grow_batch_axis"}
        out = {k: v for k, v in data.items() if k in own} | {"sweep": {k: v for k, v in data.items() if k not in own}}
        for key in ("model", "token_budget"):
            if key in out["sweep"]:
                raise ValueError(f"a study sets {key} per scale (scales, target), not at the top: remove {key}")
        if isinstance(out.get("target"), dict):
            out["target"] = _scale_in(out["target"])
        if isinstance(out.get("scales"), list):
            out["scales"] = [_scale_in(s) if isinstance(s, dict) else s for s in out["scales"]]
        return out

    @model_validator(mode="after")
    def _sweeps_valid(self) -> StudySpec:
        n = len(self.pairs())
        if not 2 <= n <= MAX_SCALES:
            raise ValueError(f"a study needs 2 to {MAX_SCALES} scales, got {n}")
        self.sweep_specs()  # each scale's sweep, validated now: a bad field names its scale
        self.target_spec()
        return self

    def pairs(self) -> list[StudyScale]:
        if isinstance(self.scales, StudyGrid):
            return [StudyScale(model=m, token_budget=t) for m in self.scales.models for t in self.scales.token_budgets]
        return list(self.scales)

    def _spec(self, name: str, scale: StudyScale, where: str) -> SweepSpec:
        data = {**self.sweep, "name": name, "model": scale.model.model_dump(exclude_unset=True)}
        data["token_budget"] = scale.token_budget
        if isinstance(data.get("batch_sizes"), dict):
            # the law is fitted from the brackets: a search's runs go to their ends too, unless the file says
            data["batch_sizes"] = {"decide_ends": True, **data["batch_sizes"]}
        try:
            spec = SweepSpec.from_mapping(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            raise ValueError(f"{where} ({_describe(scale)}): {problems}") from None
        if not self.grow_batch_axis or spec.batch_search is None:
            return spec
        return _grown(spec, scale.token_budget / min(s.token_budget for s in self.pairs()))

    def sweep_specs(self) -> list[SweepSpec]:
        """Each scale's sweep, smallest first (parameters at the sweeps' vocabulary x tokens)."""
        return list(self._sweep_specs)

    @functools.cached_property
    def _sweep_specs(self) -> tuple[SweepSpec, ...]:
        # built and validated once per study (validation, pricing and the dry run each ask; both are frozen)
        vocab = self._vocab()
        ordered = sorted(self.pairs(), key=lambda s: (s.model.parameters(vocab) * s.token_budget, s.token_budget))
        return tuple(self._spec(f"{self.name}-s{i + 1}", s, f"scale {i + 1}") for i, s in enumerate(ordered))

    def _vocab(self) -> int:
        """The sweeps' vocabulary size (the spec's data.vocab_size, or its default); one given wrongly is
        reported by each sweep's validation, and orders the scales by the default meanwhile."""
        data = self.sweep.get("data")
        given = data.get("vocab_size") if isinstance(data, dict) else None
        return given if isinstance(given, int) and given > 0 else int(DataConfig.model_fields["vocab_size"].default)

    @functools.cached_property
    def _target_spec(self) -> SweepSpec:
        return self._spec(f"{self.name}-target", self.target, "target")

    def target_spec(self) -> SweepSpec:
        """The sweep at the target scale: what the study replaces."""
        return self._target_spec

    def axis_note(self, spec: SweepSpec) -> str:
        """Where `spec` (one of this study's sweeps) searches past the file's `batch_sizes.max`, the clause saying
        who raised it, for a refusal that names a size or a count of trials the file never wrote; else ""."""
        given, search = self.sweep.get("batch_sizes"), spec.batch_search
        if search is None or not isinstance(given, dict) or given.get("max") == search.max:
            return ""
        return (
            f" (grow_batch_axis raised this sweep's batch_sizes.max from {given.get('max')} to {search.max} for its "
            f"budget; grow_batch_axis: false keeps it)"
        )


def _grown(spec: SweepSpec, ratio: float) -> SweepSpec:
    """`spec`'s batch-axis search with its max raised for a budget `ratio` x the smallest scale's: to max x ratio,
    the most a critical batch that grows no faster than the data (`extrapolated_answer`'s slope <= 1) can need
    where the smallest scale's axis was enough; else the largest of max x 2^j (j = 1, 2, ...) below it that
    keeps every rule of a sweep (the lattice's length, the trial cap) and trains exactly `spec`'s tokens: the
    larger sizes' lcm can round the budget down further, and growing adds sizes at the top, changing nothing
    else. `spec` itself where none does. Without it a study whose critical batch passes max at the larger
    budgets gets one-sided brackets there, and the law has nothing to locate."""
    search = spec.batch_search
    assert search is not None
    wanted = min(MAX_BATCH_SIZE, int(search.max * ratio))
    doublings = [search.max * 2**j for j in range(1, 32) if search.max * 2**j < wanted]
    data = spec.model_dump(mode="json", exclude_unset=True)
    for top in [wanted, *reversed(doublings)]:
        if top <= spec.lattice[-1]:
            break
        try:
            grown = SweepSpec.from_mapping(data | {"batch_sizes": {**data["batch_sizes"], "max": top}})
        except ValidationError:
            continue
        if grown.lattice != spec.lattice and grown.trained_tokens == spec.trained_tokens:
            return grown
    return spec


def confirm_spec(study: StudySpec, laws: Sequence[OptimizerLaw]) -> SweepSpec | str:
    """The sweep that tests the laws' predictions at the target: the target's spec (its lr search, seeds and
    tolerance as every scale's, its trained tokens), trained only at the reference (the smallest size it
    could test) and, for each law with a prediction, the sizes of its lattice on each side of the predicted
    B*, listed; or why there is none (no prediction inside the lattice)."""
    target = study.target_spec()
    sizes = target.lattice
    chosen = {sizes[0]}
    for law in laws:
        if law.predicted is None:
            continue
        b = law.predicted.value
        chosen |= {max((s for s in sizes if s <= b), default=sizes[0]), min((s for s in sizes if s > b), default=0)}
    chosen.discard(0)
    if len(chosen) < 2:
        return f"no law predicts a B* inside {sizes[0]}..{sizes[-1]}, the sizes the target's sweep could test"
    return _target_at(study, chosen)


def confirm_bound_spec(study: StudySpec) -> SweepSpec | None:
    """What the confirmation of `study` can cost at most, priced before its laws exist: the target's spec
    trained at the reference and at 2 x (optimizers) other sizes of its lattice, the most `confirm_spec` lists
    from one law per optimizer (two sizes a prediction), at the costliest: a cell's trials train the same tokens
    at every size, and evaluate more often at a smaller one where evaluation.every_tokens is less than a step of a
    larger (the largest among equals); None where the study does not confirm."""
    if not study.confirm:
        return None
    target = study.target_spec()  # its trials train the tokens a confirmation's do (`_target_at`)
    reference, *others = target.lattice
    opt = target.optimizer_names[0]  # evaluations do not depend on the optimizer (`sweeps.cost.price`)
    evals = {b: evaluations_per_trial(target.train_config(opt, b, target.lr.min, seed=0)) for b in others}
    costliest = sorted(others, key=lambda b: (evals[b], b))[max(0, len(others) - 2 * len(target.optimizers)) :]
    return _target_at(study, {reference, *costliest})


def _target_at(study: StudySpec, sizes: set[int]) -> SweepSpec:
    """The target's spec trained at `sizes` (listed) on the target's own trained tokens (the tokens its laws
    predict at: a multiple of every size of its lattice), named as the study's confirmation sweep."""
    target = study.target_spec()
    data = target.model_dump(mode="json", exclude_unset=True)
    data["name"] = f"{study.name}-confirm"
    data["batch_sizes"] = sorted(sizes)
    data["token_budget"] = target.trained_tokens
    return SweepSpec.from_mapping(data)


def _scale_in(d: dict[str, Any]) -> dict[str, Any]:
    return dict(d, token_budget=_whole(d.get("token_budget")))


def _describe(scale: StudyScale) -> str:
    preset = scale.model.preset or "custom"
    return f"{preset}, seq_len {scale.model.seq_len}, {scale.token_budget:.3g} tokens"


def is_study(data: Any) -> bool:
    """A spec document that is a study (it has `scales`), not a sweep."""
    return isinstance(data, dict) and "scales" in data


class StudyCost(BaseModel):
    """What a study costs: each scale's sweep, their sum, the sweep at the target it replaces, and where the
    study confirms, its confirmation at most (`confirm_bound_spec`)."""

    model_config = ConfigDict(frozen=True)

    scales: list[tuple[str, SweepCost]]
    gpu_hours: FloatRange  # the scales' sweeps together
    target: SweepCost
    ratio: FloatRange  # the scales' GPU-hours against the target sweep's, min to min and max to max
    confirmation: SweepCost | None = None  # the confirmation sweep at most; None: the study does not confirm


class SweepPrice(BaseModel):
    """One sweep of a study priced, a row of what `sweeps price` and `POST /studies/dry-run` list."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="the sweep's name: <study>-s<i>, smallest scale first; <study>-target")
    model: str = Field(description="the model preset, or custom")
    trained_tokens: int = Field(description="tokens every trial of this sweep trains on")
    batch_sizes: list[int] = Field(
        default_factory=list, description="the sizes it may train at: its list, or its search's lattice"
    )
    cost: SweepCost


def sweep_prices(study: StudySpec, cost: StudyCost) -> tuple[list[SweepPrice], SweepPrice, SweepPrice | None]:
    """The rows of `cost` (`price_study(study)`): each scale's sweep, in the order the study runs them, the
    sweep at the target, and the confirmation at most (None: the study does not confirm)."""

    def row(spec: SweepSpec, c: SweepCost) -> SweepPrice:
        return SweepPrice(
            name=spec.name,
            model=spec.model.preset or "custom",
            trained_tokens=spec.trained_tokens,
            batch_sizes=spec.lattice,
            cost=c,
        )

    scales = [row(spec, c) for spec, (_, c) in zip(study.sweep_specs(), cost.scales, strict=True)]
    bound = confirm_bound_spec(study)
    confirmation = row(bound, cost.confirmation) if bound is not None and cost.confirmation is not None else None
    return scales, row(study.target_spec(), cost.target), confirmation


def price_study(study: StudySpec, config: PriceConfig | None = None) -> StudyCost:
    costs = [(s.name, price(s, config)) for s in study.sweep_specs()]
    target = price(study.target_spec(), config)
    bound = confirm_bound_spec(study)
    lo = sum(c.gpu_hours.min for _, c in costs)
    hi = sum(c.gpu_hours.max for _, c in costs)
    return StudyCost(
        scales=costs,
        gpu_hours=FloatRange(min=lo, max=hi),
        target=target,
        ratio=FloatRange(min=lo / target.gpu_hours.min, max=hi / target.gpu_hours.max),
        confirmation=price(bound, config) if bound is not None else None,
    )


def extrapolated_answer(answers: Sequence[tuple[float, int | None]], tokens: float) -> float | None:
    """Where a search at `tokens` starts without a law: the least-squares line through the earlier scales'
    answers (token budget, the largest degradation-free batch size; None: none) in ln B over ln tokens, at
    `tokens`; its slope held to [0, 1]: more data does not shrink the critical batch (Zhang et al. 2025), and
    a line through two or three answers a lattice step apart is not trusted for more than proportional
    growth. With one budget answered, that answer; None with none. A start only: the search steps on from it as
    from any size it tested (`sweeps.batch_axis`), so a poor one costs sizes, not the answer."""
    pts = [(math.log(t), math.log(b)) for t, b in answers if b is not None]
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    if not pts:
        return None
    if len(set(xs)) == 1:
        return math.exp(max(ys))  # one budget: its (largest) answer
    slope = min(1.0, max(0.0, statistics.linear_regression(xs, ys).slope))
    return math.exp(statistics.fmean(ys) + slope * (math.log(tokens) - statistics.fmean(xs)))


def law_params(specs: Sequence[SweepSpec]) -> list[float | None]:
    """Each sweep's model size as the law takes it (`sweeps.law.Scale.params`): its parameters at its
    vocabulary where the sweeps have two or more model sizes; None for every one where they have one (the
    law is then in tokens alone)."""
    sizes = [float(s.model.parameters(s.data.vocab_size)) for s in specs]
    return sizes if len(set(sizes)) > 1 else [None] * len(sizes)


def fit_laws(target: SweepSpec, done: Sequence[tuple[SweepSpec, Report]], against: str) -> list[OptimizerLaw]:
    """The laws of a study's finished scales (`done`: each sweep's spec and report, smallest first) against
    `against`, predicted at `target` (its model size too where the scales have two or more: `law_params`):
    `sweeps.law.study_laws`, as `sweeps study`, the service and `simulate_study` fit them."""
    from sweeps.law import study_laws

    params = law_params([spec for spec, _ in done])
    at = None if params[0] is None else float(target.model.parameters(target.data.vocab_size))
    loaded = [(report, p) for (_, report), p in zip(done, params, strict=True)]
    return study_laws(loaded, float(target.trained_tokens), at, against)


def transferred(spec: SweepSpec, earlier: Sequence[tuple[SweepSpec, Report]]) -> SweepSpec:
    """`spec` starting from what the smaller scales' finished sweeps (`earlier`, smallest first) imply: a
    search of the batch axis goes, after its reference, to each optimizer's predicted boundary
    (`batch_sizes.start`): the batch law of their brackets against the search's reference at this scale
    (model size in it where the scales have two or more); without a law, the line through their answers in
    ln B over ln tokens (`extrapolated_answer`), or with one scale its answer. A list of batch sizes, or
    nothing to go on, leaves `spec` as it is."""
    from sweeps.law import BatchLaw, fit_batch_law, scale_of

    search = spec.batch_search
    if search is None or not earlier:
        return spec
    *params, here = law_params([*(s for s, _ in earlier), spec])  # the earlier scales', this one's
    starts: dict[str, int] = {}
    for opt in spec.optimizer_names:
        if not all(opt in r.optimizers for _, r in earlier):
            continue
        scales = [scale_of(r, opt, search.against, p) for (_, r), p in zip(earlier, params, strict=True)]
        law = fit_batch_law(scales) if len(scales) >= 2 else None
        if isinstance(law, BatchLaw):
            predicted: float | None = math.exp(law.mean_log(float(spec.trained_tokens), here))
        else:
            answers = [
                (scale.tokens, getattr(r.optimizers[opt].largest_degradation_free_batch_size, search.against))
                for scale, (_, r) in zip(scales, earlier, strict=True)
            ]
            predicted = extrapolated_answer(answers, float(spec.trained_tokens))
        if predicted is not None and predicted > search.min:
            starts[opt] = int(round(min(predicted, search.max)))
    if not starts:
        return spec
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["batch_sizes"] = {**data["batch_sizes"], "start": starts}
    return SweepSpec.from_mapping(data)
