"""The configuration reference, docs/configuration.md, generated from the settings classes (a test
keeps the file current):

    python -m service.config_doc > docs/configuration.md
"""

from __future__ import annotations

import importlib
import types
import typing

from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

_LAYERS = (
    ("Every process that trains (Ray workers)", "worker.settings.WorkerSettings"),
    ("`sweeps run` and the service", "sweeps.settings.SweepSettings"),
    ("The HTTP service", "service.settings.Settings"),
)


def _env_name(cls: type[BaseSettings], name: str, field: FieldInfo) -> str:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[-1])
    return f"{cls.model_config.get('env_prefix', '')}{name}".upper()


def _type_text(field: FieldInfo) -> str:
    """`str | None` -> "str" (the default column says unset), `Literal['text', 'json']` -> "text or json"."""
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(str(a) for a in typing.get_args(annotation))
    text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    for noise in ("typing.", "pathlib.", "pydantic.types.", "pydantic.networks."):
        text = text.replace(noise, "")
    return text


def _default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    if field.default is None:
        return "unset"
    return f"`{field.default}`"


def configuration_reference() -> str:
    """Every environment variable of the project: name, type, default and meaning, grouped by the layer
    that reads it (each layer's settings extend the one above in this list)."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the settings classes by `python -m service.config_doc > docs/configuration.md`; a test",
        "fails when this file and the classes differ. Nothing else in the project reads the environment",
        "(the command line's own `--url`/`--token` options aside: `SWEEPS_URL`, `SWEEPS_TOKEN`).",
        "",
    ]
    seen: set[str] = set()
    for title, dotted in _LAYERS:
        module, _, cls_name = dotted.rpartition(".")
        cls = getattr(importlib.import_module(module), cls_name)
        out += [f"## {title}", "", f"`{dotted}`", "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for name, field in cls.model_fields.items():
            if name in seen:
                continue
            seen.add(name)
            meaning = " ".join((field.description or "").split()).replace("|", "\\|")
            meaning = meaning[:1].upper() + meaning[1:]
            out.append(
                f"| `{_env_name(cls, name, field)}` | {_type_text(field)} | {_default_text(field)} | {meaning} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(configuration_reference())
