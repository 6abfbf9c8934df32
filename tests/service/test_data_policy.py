"""What the service accepts beyond SweepSpec: its limits, and data only from allowed places."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import tiny_spec

from service.errors import Invalid, Unsupported
from service.policy import data_source_problem, parse_body, validate_spec
from service.settings import Settings


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Settings, Path, Path]:
    inside = tmp_path / "corpora"
    outside = tmp_path / "private"
    (inside / "shakespeare").mkdir(parents=True)
    (inside / "shakespeare" / "a.txt").write_text("to be or not to be")
    outside.mkdir()
    (outside / "secret.txt").write_text("keys")
    settings = Settings(data_roots=[inside], hf_datasets=["wikitext:wikitext-2-raw-v1", "roneneldan/TinyStories"])
    return settings, inside, outside


def test_builtin_is_always_allowed() -> None:
    assert data_source_problem("builtin", Settings()) is None


def test_paths_inside_a_data_root_are_allowed(roots: tuple[Settings, Path, Path]) -> None:
    settings, inside, _ = roots
    assert data_source_problem(str(inside / "shakespeare"), settings) is None
    assert data_source_problem(str(inside / "shakespeare" / "a.txt"), settings) is None
    assert data_source_problem(f"hf:{inside / 'shakespeare'}", settings) is None


@pytest.mark.parametrize(
    "make_source, reason",
    [
        (lambda inside, outside: str(outside / "secret.txt"), "outside the allowed data roots"),
        (lambda inside, outside: f"{inside}/../private/secret.txt", "'..'"),
        (lambda inside, outside: "corpora/shakespeare", "absolute path"),
        (lambda inside, outside: "/etc/passwd", "outside the allowed data roots"),
        (lambda inside, outside: str(inside / "missing.txt"), "does not exist"),
        (lambda inside, outside: f"hf:{outside}", "outside the allowed data roots"),
        (lambda inside, outside: "hf:some/other-dataset", "not allowed on this service"),
    ],
)
def test_other_sources_are_refused_naming_the_field_and_value(
    roots: tuple[Settings, Path, Path], make_source: object, reason: str
) -> None:
    settings, inside, outside = roots
    source = make_source(inside, outside)  # type: ignore[operator]
    problem = data_source_problem(source, settings)
    assert problem is not None
    assert (problem["field"], problem["value"]) == ("data.source", source)
    assert reason in problem["message"]


def test_symlink_out_of_a_root_is_refused(roots: tuple[Settings, Path, Path]) -> None:
    settings, inside, outside = roots
    link = inside / "escape"
    os.symlink(outside, link)
    # the link sits inside the root, but what it reads is outside
    problem = data_source_problem(str(link / "secret.txt"), settings)
    assert problem is not None and "outside the allowed data roots" in problem["message"]


def test_configured_hf_datasets_by_name_or_with_config(roots: tuple[Settings, Path, Path]) -> None:
    settings, _, _ = roots
    assert data_source_problem("hf:wikitext:wikitext-2-raw-v1", settings) is None
    assert data_source_problem("hf:roneneldan/TinyStories", settings) is None
    # exactly as configured: another config of an allowed name, or the bare name of an allowed config, is refused
    assert "not allowed" in data_source_problem("hf:roneneldan/TinyStories:default", settings)["message"]  # type: ignore[index]
    assert "not allowed" in data_source_problem("hf:wikitext", settings)["message"]  # type: ignore[index]
    assert "not allowed" in data_source_problem("hf:wikitext:other", settings)["message"]  # type: ignore[index]


def test_limits_and_cache_dir_are_refused_by_field() -> None:
    with pytest.raises(Invalid) as info:
        validate_spec(
            tiny_spec(token_budget=6000, data={"source": "builtin", "cache_dir": "/tmp/x"}),
            Settings(max_token_budget=5000),
        )
    fields = {d["field"]: d["value"] for d in info.value.details}
    assert fields == {"token_budget": 6000, "data.cache_dir": "/tmp/x"}
    assert validate_spec(tiny_spec(), Settings(max_token_budget=6000)).token_budget == 6000
    # the trial cap is SweepSpec's own rule, fed with the service's setting
    with pytest.raises(Invalid) as info:
        validate_spec(tiny_spec(), Settings(max_trials=3))
    assert [d["field"] for d in info.value.details] == ["total_trials"]
    assert info.value.details[0]["value"] == 7  # 2 x (2 search + 1 seed) + the reference's one more


def test_parse_body_json_yaml_and_media_types() -> None:
    assert parse_body(b'{"name": "x"}', None) == {"name": "x"}
    assert parse_body(b"name: x\nseeds: 2\n", "application/yaml; charset=utf-8") == {"name": "x", "seeds": 2}
    with pytest.raises(Unsupported) as info:
        parse_body(b"name: x", "text/plain")
    assert info.value.code == "unsupported_media_type"
    with pytest.raises(Invalid) as info:
        parse_body(b"{nope", "application/json")
    assert info.value.details[0]["field"] == "body"
    with pytest.raises(Invalid) as info:
        parse_body(b"- a\n- b\n", "application/yaml")
    assert "mapping" in info.value.details[0]["message"]
