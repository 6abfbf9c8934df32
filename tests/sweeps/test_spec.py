"""sweeps.spec: SweepSpec loads, round-trips, maps onto TrainConfig, and refuses every bad spec by field and value."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

import sweeps
from sweeps.documents import MAX_NODES
from sweeps.spec import (
    DEFAULT_MAX_TRIALS,
    REFERENCE_EXTRA_TRIALS,
    SpecLoadError,
    SweepSpec,
    cell_search_trials,
    format_validation_error,
    total_trials,
)
from worker.config import EvalConfig, OptimizerConfig, ResourcesConfig, ScheduleConfig, TrainConfig, split_batch
from worker.names import OPTIMIZER_NAMES

DEMO = Path(sweeps.__file__).parent / "examples" / "demo.yaml"

BASE: dict = {
    "name": "merit-vs-adamw",
    "model": {"preset": "gpt2-nano", "seq_len": 128},
    "data": {"source": "builtin"},
    "optimizers": [{"name": "adamw"}, {"name": "merit", "betas": [0.9, 0.95], "weight_decay": 0.01}],
    "batch_sizes": [16, 32, 64, 128],
    "token_budget": 2_000_000,
    "lr": {"min": 1.0e-4, "max": 3.0e-2, "trials_per_batch_size": 6},
    "schedule": {"warmup_fraction": 0.05},
    "seeds": 3,
    "degradation": {"tolerance": 0.01, "baseline": "adamw"},
    "resources": {"workers_per_trial": 1, "gpus_per_worker": 0, "max_concurrent_trials": 2},
}


def spec_data(**changes) -> dict:
    """BASE with top-level keys replaced; `a__b=v` replaces one nested value (data["a"]["b"] = v)."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        *parents, last = key.split("__")
        target = data
        for p in parents:
            target = target.setdefault(p, {})
        target[last] = value
    return data


def refusal(data: dict, **context) -> list[dict]:
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate(data, context=context or None)
    return format_validation_error(info.value)


def only(errors: list[dict], field: str) -> dict:
    matching = [e for e in errors if e["field"] == field]
    assert len(matching) == 1, errors
    return matching[0]


# ---- loading --------------------------------------------------------------------------------------


def test_base_spec_is_valid_and_has_defaults():
    spec = SweepSpec.model_validate(BASE)
    assert spec.schedule.min_lr_ratio == 0.1
    assert spec.resources.cpus_per_worker == 1 and spec.resources.max_micro_batch == 32
    assert spec.pruning.enabled is True and spec.pruning.grace_fraction == 0.3 and spec.pruning.reduction_factor == 3
    assert spec.grad_clip == 1.0 and spec.evaluation.every_tokens is None and spec.evaluation.tokens == 32_768
    assert (spec.checkpoints.every_tokens, spec.checkpoints.min_interval_s) == (None, 300.0)
    assert spec.optimizers[0].weight_decay == 0.0 and spec.optimizers[1].betas == (0.9, 0.95)


def test_demo_example_loads():
    spec = SweepSpec.load(DEMO)
    assert spec.name == "demo"
    assert spec.model.preset == "gpt2-nano" and spec.model.seq_len == 64
    assert spec.data.source == "builtin"
    assert spec.optimizer_names == ["adamw", "merit"] and spec.degradation.baseline == "adamw"
    assert spec.batch_sizes == [8, 32, 128]
    assert spec.lr.min == 1e-4 and spec.lr.max == 3e-2 and spec.lr.trials_per_batch_size == 3
    assert spec.seeds == 4 and spec.degradation.tolerance == 0.02
    assert spec.resources.max_concurrent_trials == 2 and spec.pruning.enabled is True
    # 2 optimizers x 3 batch sizes x (3 search + 4 confirmation runs), and one more search trial at each
    # optimizer's reference (batch size 8) = 44
    assert spec.total_trials == 44


def test_yaml_and_json_text_and_files_load_the_same_spec(tmp_path):
    expected = SweepSpec.model_validate(BASE)
    yaml_text = yaml.safe_dump(BASE)
    json_text = json.dumps(BASE)
    (tmp_path / "s.yaml").write_text(yaml_text)
    (tmp_path / "s.yml").write_text(yaml_text)
    (tmp_path / "s.json").write_text(json_text)
    assert SweepSpec.from_yaml(yaml_text) == expected
    assert SweepSpec.from_json(json_text) == expected
    assert SweepSpec.from_yaml(tmp_path / "s.yaml") == expected
    assert SweepSpec.from_yaml(str(tmp_path / "s.yaml")) == expected  # a str naming a file is read
    assert SweepSpec.from_json(tmp_path / "s.json") == expected
    for name in ("s.yaml", "s.yml", "s.json"):
        assert SweepSpec.load(tmp_path / name) == expected


def test_yaml_exponent_without_a_dot_is_accepted():
    # YAML 1.1 reads `1e-4` as a string; the spec must still take it as a float
    text = yaml.safe_dump(BASE).replace("min: 0.0001", "min: 1e-4")
    assert "min: 1e-4" in text
    assert SweepSpec.from_yaml(text).lr.min == 1e-4


def test_round_trip_through_json_dump_and_yaml():
    spec = SweepSpec.model_validate(BASE)
    dumped = spec.model_dump(mode="json")
    assert SweepSpec.model_validate(dumped) == spec
    assert SweepSpec.model_validate(json.loads(json.dumps(dumped))) == spec
    assert SweepSpec.from_yaml(spec.to_yaml()) == spec


def test_load_errors():
    with pytest.raises(SpecLoadError, match="invalid YAML"):
        SweepSpec.from_yaml("name: [unclosed\nlr: 1")
    with pytest.raises(SpecLoadError, match="invalid JSON"):
        SweepSpec.from_json("{not json")
    with pytest.raises(SpecLoadError, match="not found"):
        SweepSpec.load("/nonexistent/spec.yaml")


def test_load_refuses_unknown_suffix(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text("x")
    with pytest.raises(SpecLoadError, match="'.toml'"):
        SweepSpec.load(path)


def test_yaml_validation_errors_surface_before_anything_runs():
    with pytest.raises(ValidationError) as info:
        SweepSpec.from_yaml(yaml.safe_dump(spec_data(lr={"min": 0.1, "max": 0.01})))
    assert format_validation_error(info.value)[0]["field"] == "lr.min"


# ---- refusals: each names the field and the bad value ---------------------------------------------


def test_lr_min_must_be_below_max():
    err = only(refusal(spec_data(lr={"min": 0.1, "max": 0.01})), "lr.min")
    assert err["message"] == "lr.min must be < lr.max, got min=0.1, max=0.01"
    assert err["value"] == {"min": 0.1, "max": 0.01}


def test_unknown_optimizer_lists_the_valid_ones():
    err = only(refusal(spec_data(optimizers=[{"name": "adamw"}, {"name": "sgd"}])), "optimizers.1.name")
    assert "'sgd'" in err["message"] and err["value"] == "sgd"
    assert ", ".join(OPTIMIZER_NAMES) in err["message"]


def test_duplicate_optimizer_names():
    err = only(
        refusal(spec_data(optimizers=[{"name": "adamw"}, {"name": "merit"}, {"name": "adamw"}])), "optimizers.2.name"
    )
    assert "duplicate name 'adamw' (entries 0 and 2)" in err["message"] and err["value"] == "adamw"


def test_empty_optimizers():
    err = only(refusal(spec_data(optimizers=[])), "optimizers")
    assert "must not be empty" in err["message"]


def test_empty_batch_sizes():
    err = only(refusal(spec_data(batch_sizes=[])), "batch_sizes")
    assert "must not be empty" in err["message"] and err["value"] == []


def test_unsorted_batch_sizes_say_where():
    err = only(refusal(spec_data(batch_sizes=[16, 64, 32])), "batch_sizes")
    assert "strictly increasing, got 64 before 32" in err["message"] and err["value"] == [16, 64, 32]


def test_duplicate_batch_sizes_say_which():
    err = only(refusal(spec_data(batch_sizes=[16, 32, 32, 64])), "batch_sizes")
    assert "duplicates [32]" in err["message"]


def test_non_positive_batch_sizes():
    err = only(refusal(spec_data(batch_sizes=[0, 16])), "batch_sizes")
    assert "> 0, got [0]" in err["message"]


def test_token_budget_must_cover_one_step_at_the_largest_batch():
    # 128 sequences x 128 tokens = 16384 tokens per step at the largest batch
    err = only(refusal(spec_data(token_budget=16383)), "token_budget")
    assert (
        "token_budget=16383" in err["message"]
        and "lcm(batch_sizes) = 128 x model.seq_len 128 = 16384" in err["message"]
    )
    assert err["value"] == 16383
    # exactly one step is enough
    assert SweepSpec.model_validate(spec_data(token_budget=16384)).token_budget == 16384


def test_every_batch_must_split_over_the_workers():
    data = spec_data(batch_sizes=[12, 24, 32], resources__workers_per_trial=3)
    err = only(refusal(data), "resources.workers_per_trial")
    assert "workers_per_trial=3" in err["message"] and "[32]" in err["message"] and err["value"] == 3


def test_baseline_must_be_among_the_optimizers():
    err = only(refusal(spec_data(degradation={"tolerance": 0.01, "baseline": "lion"})), "degradation.baseline")
    assert "'lion'" in err["message"] and "['adamw', 'merit']" in err["message"] and err["value"] == "lion"


def test_trial_cap_from_the_validation_context():
    # BASE: 2 optimizers x (4 batch sizes x (6 search + 3 confirmation runs) + 1 search trial more at the
    # reference) = 74 trials
    assert SweepSpec.model_validate(BASE).total_trials == 74
    err = only(refusal(BASE, max_trials=73), "total_trials")
    assert "total trials 74" in err["message"] and "max_trials=73" in err["message"] and err["value"] == 74
    assert SweepSpec.model_validate(BASE, context={"max_trials": 74}).total_trials == 74


def test_default_trial_cap():
    # 1 optimizer x 1 batch size x (DEFAULT_MAX_TRIALS - 2 + 2), + 1 search trial at the reference (that
    # size) = DEFAULT_MAX_TRIALS + 1 trials
    data = spec_data(
        optimizers=[{"name": "adamw"}],
        batch_sizes=[16],
        seeds=2,
        lr={"min": 1e-4, "max": 1e-2, "trials_per_batch_size": DEFAULT_MAX_TRIALS - 2},
    )
    assert DEFAULT_MAX_TRIALS == 1000
    err = only(refusal(data), "total_trials")
    assert f"max_trials={DEFAULT_MAX_TRIALS}" in err["message"] and err["value"] == DEFAULT_MAX_TRIALS + 1
    assert SweepSpec.from_mapping(data, max_trials=2000).total_trials == 1001
    # the driver rebuilds the spec the service stored (validated with SWEEPS_MAX_TRIALS=2000 at
    # submit) without judging it again by the default cap: a 201 never becomes a failed driver
    stored = SweepSpec.from_mapping(data, max_trials=2000).model_dump(mode="json")
    assert SweepSpec.from_stored(stored).total_trials == 1001


def test_bad_name():
    err = only(refusal(spec_data(name="Merit vs AdamW")), "name")
    assert "'Merit vs AdamW'" in err["message"]
    only(refusal(spec_data(name="x" * 65)), "name")


def test_typos_are_refused_with_a_suggestion():
    data = spec_data(lr={"min": 1e-4, "maxx": 1e-2})
    errors = refusal(data)
    typo = only(errors, "lr.maxx")
    assert "did you mean 'max'" in typo["message"] and typo["value"] == 0.01
    assert only(errors, "lr.max")["message"] == "Field required"
    top = only(refusal({**BASE, "batch_size": [16]}), "batch_size")
    assert "did you mean 'batch_sizes'" in top["message"]


def test_per_optimizer_lr_is_refused():
    # the lr is searched, so an optimizer entry has no lr field
    err = only(refusal(spec_data(optimizers=[{"name": "adamw", "lr": 1e-3}])), "optimizers.0.lr")
    assert "unknown field 'lr'" in err["message"]


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"optimizers": [{"name": "adamw", "betas": [0.9, 1.0]}]}, "optimizers.0.betas", [0.9, 1.0]),
        ({"optimizers": [{"name": "adamw", "weight_decay": -0.1}]}, "optimizers.0.weight_decay", -0.1),
        ({"degradation": {"tolerance": -0.01, "baseline": "adamw"}}, "degradation.tolerance", -0.01),
        ({"token_budget": 0}, "token_budget", 0),
        ({"seeds": 0}, "seeds", 0),
        ({"lr": {"min": 0, "max": 1e-2}}, "lr.min", 0),
        ({"lr": {"min": 1e-4, "max": 1e-2, "trials_per_batch_size": 0}}, "lr.trials_per_batch_size", 0),
        ({"schedule": {"warmup_fraction": 1.0}}, "schedule.warmup_fraction", 1.0),
        ({"pruning": {"grace_fraction": 0}}, "pruning.grace_fraction", 0),
        ({"resources": {"workers_per_trial": 0}}, "resources.workers_per_trial", 0),
        ({"eval_every_tokens": 0}, "eval_every_tokens", 0),
        ({"model": {"preset": "gpt2-xxl"}}, "model", {"preset": "gpt2-xxl"}),
    ],
)
def test_field_refusals_name_field_and_value(changes, field, value):
    err = only(refusal(spec_data(**changes)), field)
    assert err["value"] == value
    if field == "model":  # the reused ModelConfig names the preset and the valid ones
        assert "'gpt2-xxl'" in err["message"] and "gpt2-nano" in err["message"]


def test_errors_are_json_serializable():
    errors = refusal(spec_data(lr={"min": 0.1, "max": 0.01}, batch_sizes=[32, 16], name="A B", foo=object()))
    json.dumps(errors)
    assert {e["field"] for e in errors} == {"lr.min", "batch_sizes", "name", "foo"}


# ---- derived values -------------------------------------------------------------------------------


def test_total_trials_and_cells():
    spec = SweepSpec.model_validate(
        spec_data(optimizers=[{"name": "merit"}, {"name": "adamw"}, {"name": "lion"}], batch_sizes=[16, 64], seeds=2)
    )
    # 3 optimizers x (2 batch sizes x (6 search + 2 confirmation runs) + 1 search trial more at batch size 16)
    assert spec.total_trials == 51
    assert total_trials(3, 2, 6, 2) == 51 and total_trials(3, 0, 6, 2) == 0
    assert [cell_search_trials(6, reference=r) for r in (True, False)] == [6 + REFERENCE_EXTRA_TRIALS, 6]
    # optimizer order as given, batch sizes ascending
    assert spec.cells() == [("merit", 16), ("merit", 64), ("adamw", 16), ("adamw", 64), ("lion", 16), ("lion", 64)]


def test_train_config_maps_the_spec_onto_one_run():
    data = spec_data(
        optimizers=[
            {"name": "adamw"},
            {"name": "lamb", "betas": [0.9, 0.95], "weight_decay": 0.01, "eps": 1e-7, "extra": {"max_grad_norm": 2.0}},
        ],
        schedule={"warmup_fraction": 0.1, "min_lr_ratio": 0.2},
        resources={"workers_per_trial": 2, "gpus_per_worker": 0.5, "cpus_per_worker": 3, "max_micro_batch": 8},
        eval_every_tokens=50_000,
        grad_clip=0.5,
    )
    spec = SweepSpec.model_validate(data)
    cfg = spec.train_config("lamb", 64, 3e-3, seed=7)
    assert isinstance(cfg, TrainConfig)
    assert cfg.model == spec.model and cfg.data == spec.data
    assert cfg.optimizer == OptimizerConfig(
        name="lamb", lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01, eps=1e-7, extra={"max_grad_norm": 2.0}
    )
    # 2,000,000 rounded down once to a multiple of lcm(16..128) x 128 = 16,384 tokens: 122 x 16,384
    assert (cfg.batch_size, cfg.token_budget, cfg.seed) == (64, 1_998_848, 7)
    assert cfg.schedule == ScheduleConfig(warmup_fraction=0.1, min_lr_ratio=0.2) and cfg.grad_clip == 0.5
    assert cfg.evaluation == EvalConfig(every_tokens=50_000)
    assert cfg.resources == ResourcesConfig(
        workers_per_trial=2, gpus_per_worker=0.5, cpus_per_worker=3, max_micro_batch=8
    )
    assert cfg.resources.use_gpu
    # gpus_per_worker 0 -> CPU
    assert SweepSpec.model_validate(BASE).train_config("adamw", 16, 1e-3, seed=0).resources.use_gpu is False


def test_train_config_refuses_cells_outside_the_spec():
    spec = SweepSpec.model_validate(BASE)
    with pytest.raises(KeyError, match="'lion'"):
        spec.train_config("lion", 16, 1e-3, seed=0)
    with pytest.raises(ValueError, match="batch_size=24"):
        spec.train_config("adamw", 24, 1e-3, seed=0)


def test_to_optimizer_config_adds_the_lr():
    spec = SweepSpec.model_validate(BASE)
    cfg = spec.optimizer("merit").to_optimizer_config(2e-3)
    assert cfg == OptimizerConfig(name="merit", lr=2e-3, betas=(0.9, 0.95), weight_decay=0.01)


def test_spec_module_does_not_import_torch():
    # the HTTP service imports sweeps.spec; it must stay torch-free
    code = "import sys, sweeps.spec; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ---- bounded parsing: one parser for the CLI and the service ---------------------------------------


def test_yaml_aliases_are_refused_naming_the_line(tmp_path):
    text = yaml.safe_dump(BASE) + "extra_anchor: &a [1, 2]\nuse: *a\n"
    with pytest.raises(SpecLoadError, match=r"aliases .* not accepted \(line \d+\)"):
        SweepSpec.from_yaml(text)
    path = tmp_path / "bomb.yaml"
    path.write_text("name: x\nself: &s [*s]\n")
    with pytest.raises(SpecLoadError, match=r"line 2\).*bomb.yaml"):
        SweepSpec.load(path)


def test_service_and_cli_share_the_parser():
    # the HTTP API's refusal of a body is the same sentence SweepSpec.from_yaml raises
    from service.errors import Invalid
    from service.policy import parse_body

    document = "name: x\nlr: &l {min: 0.001, max: 0.01}\nagain: *l\n"
    with pytest.raises(SpecLoadError) as spec_error:
        SweepSpec.from_yaml(document)
    with pytest.raises(Invalid) as api_error:  # the HTTP layer answers it with a 422
        parse_body(document.encode(), "application/yaml")
    assert api_error.value.details[0]["message"] == str(spec_error.value)


@pytest.mark.parametrize(
    ("loader", "text", "words"),
    [
        (SweepSpec.from_json, "[" * 10_000, "nested deeper than 32"),
        (SweepSpec.from_yaml, "a: " + "[" * 10_000, "nested deeper than 32"),
        (SweepSpec.from_json, json.dumps({"batch_sizes": [1] * (2 * MAX_NODES)}), f"more than {MAX_NODES} values"),
        (SweepSpec.from_json, json.dumps(BASE).replace('"max": 0.03', '"max": Infinity'), "Infinity"),
        (SweepSpec.from_json, json.dumps(BASE).replace('"max": 0.03', '"max": 1e999'), "finite"),
        (SweepSpec.from_yaml, yaml.safe_dump(BASE).replace("max: 0.03", "max: .nan"), "finite"),
    ],
)
def test_deep_huge_and_non_finite_documents_are_load_errors(loader, text, words):
    with pytest.raises(SpecLoadError, match=words):
        loader(text)


# ---- bounds: every number that costs CPU or memory -------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"batch_sizes": [16, 65_537]}, "batch_sizes"),
        ({"batch_sizes": [2**i for i in range(4, 37)]}, "batch_sizes"),  # 33 batch sizes
        ({"resources": {"max_micro_batch": 1025}}, "resources.max_micro_batch"),
        ({"resources": {"cpus_per_worker": 129}}, "resources.cpus_per_worker"),
        ({"resources": {"gpus_per_worker": 8.5}}, "resources.gpus_per_worker"),
        ({"resources": {"workers_per_trial": 128}}, "resources.workers_per_trial"),
        ({"model": {"preset": "gpt2-nano", "seq_len": 8193}}, "model.seq_len"),
        ({"model": {"preset": "gpt2-medium", "seq_len": 8192}}, "model"),  # preset x seq_len
        ({"lr": {"min": 1e-4, "max": float("inf")}}, "lr.max"),
        ({"degradation": {"tolerance": float("nan"), "baseline": "adamw"}}, "degradation.tolerance"),
        ({"optimizers": [{"name": "adamw", "weight_decay": float("inf")}]}, "optimizers.0.weight_decay"),
    ],
)
def test_upper_bounds_and_finite_numbers(changes, field):
    err = only(refusal(spec_data(**changes)), field)
    assert err["message"]


def test_optimizer_extra_is_checked_against_its_keywords():
    errors = refusal(spec_data(optimizers=[{"name": "adamw", "extra": {"fusd": True}}, {"name": "lion", "eps": 1e-8}]))
    fusd = only(errors, "optimizers.0.extra.fusd")
    assert "did you mean" not in fusd["message"] and "valid keywords: amsgrad" in fusd["message"]
    assert "takes no eps" in only(errors, "optimizers.1.eps")["message"]
    errors = refusal(spec_data(optimizers=[{"name": "adamw", "extra": {"foreach": [1]}}]))
    assert only(errors, "optimizers.0.extra.foreach")["value"] == [1]
    ok = SweepSpec.model_validate(spec_data(optimizers=[{"name": "adamw", "extra": {"foreach": False}}]))
    assert ok.train_config("adamw", 16, 1e-3, seed=0).optimizer.extra == {"foreach": False}


def test_seq_len_is_checked_against_the_builtin_corpus():
    # micro-batches of 256 sequences of 4097 tokens need 1.05M training tokens; the corpus has ~571k
    data = spec_data(
        model={"preset": "gpt2-nano", "seq_len": 4096},
        batch_sizes=[256],
        token_budget=256 * 4096,
        resources={"max_micro_batch": 256},
    )
    err = only(refusal(data), "model.seq_len")
    assert "builtin corpus" in err["message"] and err["value"] == 4096
    data["resources"]["max_micro_batch"] = 32  # the same batch, in smaller micro-batches, fits
    assert SweepSpec.model_validate(data).model.seq_len == 4096
    # a val split too small for one sequence is refused too
    small_val = spec_data(model={"preset": "gpt2-nano", "seq_len": 2048}, data={"val_fraction": 0.001})
    small_val["token_budget"] = 128 * 2048
    assert "validation tokens" in only(refusal(small_val), "model.seq_len")["message"]


def test_split_batch_is_cheap_and_unchanged():
    # the largest micro-batch <= max_micro_batch dividing the per-worker batch, as before
    for batch in range(1, 200):
        for workers in (1, 2, 3):
            if batch % workers:
                continue
            per = batch // workers
            expected = max(d for d in range(1, min(per, 16) + 1) if per % d == 0)
            assert split_batch(batch, workers, 16) == (expected, per // expected)
    started = time.perf_counter()
    for _ in range(100):
        split_batch(65_521, 1, 1024)  # a prime: every candidate is tried
    assert time.perf_counter() - started < 0.5


def test_refused_values_and_keys_are_excerpted():
    errors = refusal(spec_data(name="n" * 10_000, **{"k" * 10_000: 1}))
    for e in errors:
        assert len(json.dumps(e["value"])) < 200 and len(e["field"]) < 100 and len(e["message"]) < 2000


def test_every_cell_trains_on_exactly_the_same_tokens():
    # batch sizes 8..128 at seq_len 64 with a budget of 16,192 tokens: rounding per batch size trained
    # 15,872 tokens at 8 and 8,192 at 128 (48% fewer). Rounded once for the sweep: lcm 128 x 64 = 8,192
    # tokens in every cell, in whole steps (128 steps at 8, 1 at 128)
    spec = SweepSpec.model_validate(
        spec_data(batch_sizes=[8, 16, 32, 64, 128], token_budget=16_192, model={"preset": "gpt2-nano", "seq_len": 64})
    )
    assert spec.trained_tokens == 8_192
    trained = {
        b: (c := spec.train_config("merit", b, 1e-3, seed=0)).total_steps * c.tokens_per_step for b in spec.batch_sizes
    }
    assert set(trained.values()) == {8_192}
    # the demo spec trained 77,824 tokens at batch 64 against 79,872 at 8-32: now one budget for all
    demo = SweepSpec.load(DEMO)
    steps = {b: demo.train_config("adamw", b, 1e-3, 0) for b in demo.batch_sizes}
    assert {c.total_steps * c.tokens_per_step for c in steps.values()} == {demo.trained_tokens} == {81_920}


def test_seeds_is_a_number_or_an_adaptive_range_with_one_readable_refusal():
    spec = SweepSpec.model_validate(spec_data(seeds={"min": 2, "max": 6}))
    assert (spec.seeds_min, spec.seeds_max, spec.seeds_step, spec.noise_looks) == (2, 6, 2, 3)
    # the stored form rebuilds the same spec (the driver reads it back)
    assert SweepSpec.from_stored(spec.model_dump(mode="json")) == spec
    # min == max is the plain number
    assert SweepSpec.model_validate(spec_data(seeds={"min": 3, "max": 3})).seeds == 3
    err = only(refusal(spec_data(seeds={"min": 1, "max": 4})), "seeds")
    assert err["message"] == "seeds.min: Input should be greater than or equal to 2"
    err = only(refusal(spec_data(seeds={"min": 4, "max": 2})), "seeds")
    assert "seeds.max must be >= seeds.min, got min=4, max=2" in err["message"]
    err = only(refusal(spec_data(seeds="many")), "seeds")
    assert err["message"] == "seeds must be a whole number or {min, max, step}, got seeds='many'"


def test_checkpoints_every_evaluation_by_default_in_whole_evaluations_or_none() -> None:
    # at bs 16 x seq_len 128: 2,048 tokens a step, an evaluation every 4 steps (8,192 tokens)
    base = {**BASE, "token_budget": 163_840, "eval_every_tokens": 8192}
    spec = SweepSpec.from_mapping(base)
    cfg = spec.train_config(spec.optimizer_names[0], 16, 1e-3, 0)
    assert (cfg.checkpoint_every_evals, cfg.checkpoints.min_interval_s) == (1, 300.0)
    # 20,000 tokens at 8,192 tokens an evaluation: every 2 evaluations (rounded); 0: none
    every = SweepSpec.from_mapping({**base, "checkpoint_every_tokens": 20_000, "checkpoint_min_interval_s": 0})
    cfg = every.train_config(spec.optimizer_names[0], 16, 1e-3, 0)
    assert (cfg.checkpoint_every_evals, cfg.checkpoints.min_interval_s) == (2, 0.0)
    off = SweepSpec.from_mapping({**base, "checkpoint_every_tokens": 0})
    assert off.train_config(spec.optimizer_names[0], 16, 1e-3, 0).checkpoint_every_evals == 0
    with pytest.raises(ValidationError, match="checkpoint_min_interval_s"):
        SweepSpec.from_mapping({**base, "checkpoint_min_interval_s": -1})


FLAT = {
    "eval_every_tokens": 8192,
    "eval_tokens": 4096,
    "checkpoint_every_tokens": 20_000,
    "checkpoint_min_interval_s": 0,
}
SECTIONS = {
    "evaluation": {"every_tokens": 8192, "tokens": 4096},
    "checkpoints": {"every_tokens": 20_000, "min_interval_s": 0},
}


def test_the_flat_evaluation_and_checkpoint_keys_mean_their_sections() -> None:
    flat, sections = SweepSpec.from_mapping({**BASE, **FLAT}), SweepSpec.from_mapping({**BASE, **SECTIONS})
    assert flat == sections and flat.train_config("adamw", 16, 1e-3, 0) == sections.train_config("adamw", 16, 1e-3, 0)
    # a dump gives the sections only, and reads back to the same spec; a spec stored in the flat form loads
    dumped = flat.model_dump(mode="json")
    assert not dumped.keys() & FLAT.keys() and dumped["evaluation"] == {"every_tokens": 8192, "tokens": 4096}
    assert SweepSpec.from_stored(dumped) == flat
    stored = {**{k: v for k, v in dumped.items() if k not in SECTIONS}, **FLAT}
    assert SweepSpec.from_stored(stored) == flat
    # one key flat, the rest of its section given: merged; the flat checkpoint floor keeps its 300 s default
    mixed = SweepSpec.from_mapping({**BASE, "eval_tokens": 4096, "evaluation": {"every_tokens": 8192}})
    assert mixed.evaluation == flat.evaluation
    assert SweepSpec.from_mapping({**BASE, "checkpoint_every_tokens": 0}).checkpoints.min_interval_s == 300.0
    assert SweepSpec.from_mapping({**BASE, "checkpoints": {"every_tokens": 0}}).checkpoints.min_interval_s == 300.0


def test_a_setting_given_flat_and_in_its_section_is_refused_naming_the_key() -> None:
    err = only(refusal({**BASE, "eval_tokens": 4096, "evaluation": {"tokens": 2048}}), "eval_tokens")
    assert "eval_tokens and evaluation.tokens are one setting" in err["message"] and err["value"] == 4096
    err = only(
        refusal({**BASE, "checkpoint_min_interval_s": 0, "checkpoints": {"min_interval_s": 5}}),
        "checkpoint_min_interval_s",
    )
    assert "give checkpoints.min_interval_s only" in err["message"]


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"eval_every_tokens": 0}, "eval_every_tokens", 0),
        ({"eval_tokens": -1}, "eval_tokens", -1),
        ({"checkpoint_every_tokens": -1}, "checkpoint_every_tokens", -1),
        ({"checkpoint_min_interval_s": -1}, "checkpoint_min_interval_s", -1),
        ({"evaluation": {"every_tokens": 0}}, "evaluation.every_tokens", 0),
        ({"evaluation": {"tokens": 0}}, "evaluation.tokens", 0),
        ({"checkpoints": {"min_interval_s": -1}}, "checkpoints.min_interval_s", -1),
    ],
)
def test_evaluation_and_checkpoint_refusals_name_the_key_as_given(changes, field, value) -> None:
    errors = refusal({**BASE, **changes, "token_budget": 0})  # and a refusal elsewhere: both reported
    assert only(errors, field)["value"] == value and only(errors, "token_budget")


def test_a_run_config_is_grouped_in_the_spec_s_sections() -> None:
    cfg = TrainConfig(
        schedule={"warmup_steps": 3},
        evaluation={"every_tokens": 2048, "probe_attention": False},
        checkpoints={"every_tokens": 6144},
        resources={"workers_per_trial": 2, "max_micro_batch": 4},
        batch_size=16,
        token_budget=16 * 128 * 10,
    )
    assert (cfg.warmup_total_steps, cfg.eval_interval_steps, cfg.checkpoint_every_evals) == (3, 1, 3)
    assert not cfg.resources.use_gpu and cfg.resources.cpus_per_worker is None  # a run's own: the threads torch finds
    assert TrainConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # the wire form (Ray, Tune) is a dict
    with pytest.raises(ValidationError, match="give warm-up one way"):
        TrainConfig(schedule={"warmup_fraction": 0.1, "warmup_steps": 3})
    with pytest.raises(ValidationError, match="resources.max_micro_batch"):
        TrainConfig(resources={"max_micro_batch": 0})
    with pytest.raises(ValidationError, match="cannot be split evenly over num_workers=3"):
        TrainConfig(resources={"workers_per_trial": 3}, batch_size=16)


def test_warmup_is_given_one_way_and_travels_to_every_trial_and_the_report() -> None:
    from harness import tiny_spec

    from sweeps.analysis import build_report

    spec = SweepSpec.from_mapping(tiny_spec(schedule={"warmup_tokens": 4096}))
    cfg = spec.train_config(spec.optimizer_names[0], spec.batch_sizes[-1], 1e-3, 1)
    assert (cfg.schedule.warmup_tokens, cfg.schedule.warmup_steps) == (4096, None)
    report = build_report([], spec=spec)
    assert report.warmup == (
        "linear warm-up over 4,096 tokens at every batch size (fewer steps at a larger one); only the peak lr is searched"
    )
    steps = SweepSpec.from_mapping(tiny_spec(schedule={"warmup_steps": 10}))
    assert steps.train_config(steps.optimizer_names[0], 4, 1e-3, 1).schedule.warmup_steps == 10
    assert "5% of each trial's steps" in SweepSpec.from_mapping(tiny_spec()).schedule.describe_warmup()
    with pytest.raises(ValidationError, match="give warm-up one way"):
        SweepSpec.from_mapping(tiny_spec(schedule={"warmup_fraction": 0.1, "warmup_steps": 10}))
    with pytest.raises(ValidationError, match="give warm-up one way"):
        SweepSpec.from_mapping(tiny_spec(schedule={"warmup_tokens": 100, "warmup_steps": 10}))
