"""What the service accepts: a valid `SweepSpec`, within this deployment's limits and data policy.

`SweepSpec` validates the spec itself (the same rules as `sweeps run`); on top of it the service caps
trials and token budget (settings), allows only the builtin corpus, files under the configured data
roots and the configured HF datasets, and refuses `data.cache_dir` (it would let a client choose where
the cluster writes). Every refusal is a `{"field", "message", "value"}` problem, as in
`sweeps.spec.format_validation_error`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import ValidationError

from service.errors import ApiError, invalid
from service.settings import Settings
from sweeps.spec import SweepSpec, format_validation_error

JSON_TYPES = frozenset({"application/json", "text/json"})
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})


def parse_body(body: bytes, content_type: str | None) -> Any:
    """The submitted document: JSON by default, YAML when the Content-Type says so."""
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES | YAML_TYPES:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type {media!r} is not accepted; send application/json or application/yaml",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("the request body is not UTF-8", [_problem("body", "not UTF-8 text")]) from None
    try:
        data = yaml.safe_load(text) if media in YAML_TYPES else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        kind = "YAML" if media in YAML_TYPES else "JSON"
        raise invalid(f"the request body is not valid {kind}", [_problem("body", f"invalid {kind}: {exc}")]) from None
    if not isinstance(data, dict):
        raise invalid(
            "a sweep spec is a mapping",
            [_problem("body", f"expected a mapping of spec fields, got {type(data).__name__}", data)],
        )
    return data


def validate_spec(data: dict[str, Any], settings: Settings) -> SweepSpec:
    """The spec, or `ApiError(422)` naming every refused field and its value."""
    try:
        spec = SweepSpec.model_validate(data, context={"max_trials": settings.max_trials})
    except ValidationError as exc:
        problems = format_validation_error(exc)
        raise invalid(_summary(problems), problems) from None
    problems = policy_problems(spec, settings)
    if problems:
        raise invalid(_summary(problems), problems)
    return spec


def policy_problems(spec: SweepSpec, settings: Settings) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    if spec.token_budget > settings.max_token_budget:
        problems.append(
            _problem(
                "token_budget",
                f"token_budget={spec.token_budget} exceeds this service's limit max_token_budget="
                f"{settings.max_token_budget}",
                spec.token_budget,
            )
        )
    if spec.data.cache_dir is not None:
        problems.append(
            _problem(
                "data.cache_dir",
                "data.cache_dir cannot be set through the service; the cluster's own token cache is used",
                spec.data.cache_dir,
            )
        )
    problem = data_source_problem(spec.data.source, settings)
    if problem is not None:
        problems.append(problem)
    return problems


def data_source_problem(source: str, settings: Settings) -> dict[str, Any] | None:
    """None when `source` is allowed: "builtin", a configured HF dataset, or a path inside a data root."""
    if source == "builtin":
        return None
    if source.startswith("hf:"):
        rest = source[len("hf:") :]
        if rest in settings.hf_datasets or rest.partition(":")[0] in settings.hf_datasets:
            return None
        if _looks_like_path(rest):  # a dataset saved with save_to_disk: the path rules apply
            return _path_problem(rest, source, settings)
        allowed = ", ".join(f"hf:{name}" for name in settings.hf_datasets) or "none"
        return _problem(
            "data.source",
            f"HF dataset {rest!r} is not allowed on this service; allowed HF datasets: {allowed}",
            source,
        )
    return _path_problem(source, source, settings)


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "~", ".")) or (os.sep in text and Path(text).expanduser().exists())


def _path_problem(path_text: str, source: str, settings: Settings) -> dict[str, Any] | None:
    roots = settings.data_roots
    allowed = ", ".join(str(r) for r in roots) or "none configured (SWEEPS_DATA_ROOTS)"
    if ".." in PurePosixPath(path_text).parts:
        return _problem("data.source", f"data.source must not contain '..' components; data roots: {allowed}", source)
    if not os.path.isabs(path_text):
        # the driver runs in a Ray worker with another working directory: relative paths are ambiguous
        return _problem("data.source", f"data.source must be an absolute path inside a data root: {allowed}", source)
    # realpath follows symlinks: a link inside a root that points outside it is refused too
    real = Path(os.path.realpath(path_text))
    if not any(real == root or real.is_relative_to(root) for root in roots):
        return _problem(
            "data.source", f"data.source {path_text!r} is outside the allowed data roots: {allowed}", source
        )
    if not real.exists():
        return _problem("data.source", f"data.source {path_text!r} does not exist", source)
    return None


def _problem(field: str, message: str, value: Any = None) -> dict[str, Any]:
    return {"field": field, "message": message, "value": value}


def _summary(problems: list[dict[str, Any]]) -> str:
    fields = ", ".join(p["field"] or "(spec)" for p in problems)
    return f"invalid sweep spec: {fields}"
