"""Every example spec loads, each states its own price truly, and the paper's GPT-2 Medium protocol
costs what the formula says: thousands of H100-hours."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from sweeps.cost import PriceConfig, price
from sweeps.spec import SweepSpec
from sweeps.study import StudySpec, is_study, price_study

EXAMPLES = Path(__file__).resolve().parents[2] / "sweeps" / "examples"
STUDIES = sorted(p for p in EXAMPLES.glob("*.yaml") if is_study(yaml.safe_load(p.read_text())))
SPECS = sorted(set(EXAMPLES.glob("*.yaml")) - set(STUDIES))
PRICE = re.compile(r"^# Price \(`sweeps price (\S+)`\): ([\d,.]+) GPU-hours on (\S+) at MFU ([\d.]+):$", re.M)
STUDY_PRICE = re.compile(
    r"^# Price \(`sweeps price (\S+)`\): ([\d,.]+) GPU-hours on (\S+) at MFU ([\d.]+),\n# ([\d.]+) of the ([\d,]+) ",
    re.M,
)


def test_the_examples_are_there() -> None:
    names = {p.name for p in SPECS}
    assert {"demo.yaml", "merit_gpt2.yaml", "merit_gpt2_small.yaml", "merit_gpt2_reduced.yaml"} <= names
    assert [p.name for p in STUDIES] == ["merit_law_study.yaml"]


def test_the_study_example_states_its_price_truly_beside_the_target_s_sweep() -> None:
    (path,) = STUDIES
    found = STUDY_PRICE.findall(path.read_text())
    assert len(found) == 1, f"{path.name} has no '# Price (`sweeps price ...`): N GPU-hours ..., R of the T' lines"
    (named, hours, gpu, mfu, ratio, target) = found[0]
    assert named == f"sweeps/examples/{path.name}"
    study = StudySpec.model_validate(yaml.safe_load(path.read_text()))
    cost = price_study(study, PriceConfig(gpu=gpu, mfu=float(mfu)))
    assert hours == f"{cost.gpu_hours.max:,.0f}" and target == f"{cost.target.gpu_hours.max:,.0f}"
    assert ratio == f"{cost.ratio.max:.2f}"
    # the target is the paper's scale: GPT-2 Medium at 48B tokens, the protocol of merit_gpt2.yaml
    paper = SweepSpec.load(EXAMPLES / "merit_gpt2.yaml")
    target = study.target_spec()
    assert (target.model.preset, target.token_budget) == (paper.model.preset, paper.token_budget)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_example_loads_and_prices(path: Path) -> None:
    spec = SweepSpec.load(path)
    cost = price(spec)
    assert cost.trials.max == spec.total_trials and cost.gpu_hours.max > 0


@pytest.mark.parametrize("path", [p for p in SPECS if p.name.startswith("merit_")], ids=lambda p: p.name)
def test_each_merit_example_states_its_price_truly(path: Path) -> None:
    """The comment was written by `sweeps price`; it must still be what `sweeps price` says."""
    found = PRICE.findall(path.read_text())
    assert len(found) == 1, f"{path.name} has no '# Price (`sweeps price ...`): N GPU-hours ...' line"
    (named, hours, gpu, mfu) = found[0]
    assert named == f"sweeps/examples/{path.name}"
    cost = price(SweepSpec.load(path), PriceConfig(gpu=gpu, mfu=float(mfu)))
    assert hours == f"{cost.gpu_hours.max:,.0f}"


@pytest.mark.parametrize("path", [p for p in SPECS if p.name.startswith("merit_")], ids=lambda p: p.name)
def test_the_merit_examples_train_at_bf16(path: Path) -> None:
    """The paper's runs are bf16 on H100s: every trial of the example gets bf16 autocast."""
    spec = SweepSpec.load(path)
    assert spec.precision == "bf16"
    assert spec.train_config(spec.optimizer_names[0], spec.lattice[0], spec.lr.min, 0).precision == "bf16"


def test_the_papers_medium_protocol_costs_thousands_of_h100_hours() -> None:
    spec = SweepSpec.load(EXAMPLES / "merit_gpt2.yaml")
    # what the file says, read independently of the pricing code
    L, d, T, V = 24, 1024, 1024, 50257  # GPT-2 Medium at GPT-2's context and vocabulary
    optimizers, batch_sizes, search, seeds = 3, [480, 1024, 2048, 4096, 6144, 8192], 6, 3
    assert (spec.model.preset, spec.model.seq_len, spec.data.vocab_size) == ("gpt2-medium", T, V)
    assert (spec.optimizer_names, spec.batch_sizes) == (["adamw", "lamb", "merit"], batch_sizes)
    assert (spec.lr.trials_per_batch_size, spec.seeds) == (search, seeds)
    trials = optimizers * (len(batch_sizes) * (search + seeds) + 1)  # and one more search trial at batch 480
    unit = math.lcm(*batch_sizes) * T  # every batch size trains the same whole number of steps
    tokens = 48_000_000_000 // unit * unit
    n = L * (12 * d * d + 13 * d) + V * d + 2 * d  # N of 6N: all but the position embeddings
    train_flops = trials * tokens * (6 * n + 12 * L * T * d)
    per_eval = 4_194_304  # eval_tokens: 4,096 whole windows of 1,024
    evals = 0
    for b in batch_sizes:
        steps = tokens // (b * T)
        every = round(1_000_000_000 / (b * T))  # eval_every_tokens in steps
        reference = 1 if b == batch_sizes[0] else 0  # the reference's one more search trial
        evals += optimizers * (search + reference + seeds) * math.ceil(steps / every)
    eval_flops = evals * per_eval * (2 * n + 4 * L * T * d)
    expected_hours = (train_flops + eval_flops) / (0.4 * 989e12) / 3600

    cost = price(spec, PriceConfig(gpu="H100", mfu=0.4))
    assert cost.gpu_hours.max == pytest.approx(expected_hours, rel=1e-12)
    assert 1_000 <= expected_hours < 100_000  # thousands of GPU-hours, and so the user must see it
    assert cost.training_tokens.max == trials * tokens and cost.evaluations.max == evals
