"""Objects of a sweep's driver that Ray Tune pickles but must never rebuild."""

from __future__ import annotations


class DriverOnly:
    """For objects Tune pickles into its experiment folder (searcher, callbacks, stopper) so that
    `Tuner.restore` could rebuild them. Sweeps never restore a Tuner (a re-run resumes from the
    Optuna storage) and these objects hold locks, threads and database clients: they pickle as an
    inert placeholder instead."""

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (DetachedPlaceholder, (type(self).__name__,))


class DetachedPlaceholder:
    def __init__(self, name: str) -> None:
        self.name = name
