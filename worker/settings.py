"""What a training run takes from its node's environment, typed (pydantic-settings).

The settings of a layer extend the one below it: `WorkerSettings` here, `sweeps.settings.SweepSettings`
(what a sweep needs), `service.settings.Settings` (the HTTP service). Nothing else in the project reads
the environment; `docs/configuration.md` is generated from these classes (`python -m service.config_doc`).

The last three are facts about the node a run lands on (where its disk cache is, what its GPU can do, what
it may read), so a worker reads them where it runs rather than from the driver's machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_CACHE = Path("~/.cache/batchsweep")


def split_csv(value: Any) -> Any:
    """ "a, b,,c" -> ["a", "b", "c"]; lists (constructor arguments) and None pass through."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def env_field(default: Any, name: str, **kwargs: Any) -> Any:
    """A field read from the variable `name` as it is (no prefix), or passed by its field name."""
    field_name = name.removeprefix("SWEEPS_").removeprefix("BATCHSWEEP_").lower()
    return Field(default=default, validation_alias=AliasChoices(field_name, name), **kwargs)


class WorkerSettings(BaseSettings):
    """Read on the node that trains (each Ray worker), from its own environment."""

    model_config = SettingsConfigDict(
        extra="ignore", populate_by_name=True, hide_input_in_errors=True, use_attribute_docstrings=True
    )

    ray_address: str | None = env_field(None, "RAY_ADDRESS")
    """the Ray cluster (ray://, host:port, auto); None: start a local one on 127.0.0.1 (`sweeps run`), or the
    service's own head (which outlives it; `sweeps stop-head` stops it)"""
    cache: Path | None = env_field(None, "BATCHSWEEP_CACHE")
    """tokenized corpora, shared by every run on the node (a run's data.cache_dir wins); None: ~/.cache/batchsweep"""
    peak_tflops: float | None = env_field(None, "BATCHSWEEP_PEAK_TFLOPS", gt=0)
    """peak dense bf16 TFLOP/s of this node's accelerator, for MFU; None: the GPU's entry in worker/hardware.py's
    table (none on CPU)"""
    data_roots: Annotated[list[Path] | None, NoDecode] = env_field(None, "SWEEPS_DATA_ROOTS")
    """comma-separated directories that local data sources must lie in. Unset: any path (`sweeps run` on your own
    machine); set but empty: no local path. The service refuses a spec outside them before it runs."""

    @field_validator("data_roots", mode="before")
    @classmethod
    def _parse_roots(cls, value: Any) -> Any:
        return split_csv(value)

    @field_validator("data_roots", mode="after")
    @classmethod
    def _absolute_roots(cls, value: list[Path] | None) -> list[Path] | None:
        return None if value is None else [p.expanduser().resolve() for p in value]

    @property
    def cache_root(self) -> Path:
        return (self.cache or DEFAULT_CACHE).expanduser()
