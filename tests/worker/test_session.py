"""worker.session: the Ray Train and Tune sessions restore a checkpoint the same way (one implementation,
`worker.session._restored`, fed each one's `get_checkpoint`). No Ray cluster: `get_checkpoint` is faked."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.session import LocalSession, RayTrainSession, TuneSession


class FakeCheckpoint:
    """What the sessions use of a Ray `Checkpoint`: `as_directory()`, a context manager giving a path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.open = False

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        self.open = True
        try:
            yield str(self.path)
        finally:
            self.open = False


@pytest.mark.parametrize("kind", ["train", "tune"])
def test_ray_sessions_restore_the_checkpoint_their_library_gives(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.train
    from ray import tune

    module, cls = (ray.train, RayTrainSession) if kind == "train" else (tune, TuneSession)
    session = object.__new__(cls)  # restoring needs no Ray context
    calls: list[FakeCheckpoint | None] = []

    def get_checkpoint(value: FakeCheckpoint | None) -> FakeCheckpoint | None:
        calls.append(value)
        return value

    checkpoint = FakeCheckpoint(tmp_path)
    monkeypatch.setattr(module, "get_checkpoint", lambda: get_checkpoint(checkpoint))
    restoring = session.restored_checkpoint()
    assert calls == []  # asked for only when the block is entered
    with restoring as path:
        assert path == tmp_path and isinstance(path, Path)
        assert checkpoint.open  # the directory stays materialised while the loop reads it
    assert not checkpoint.open and calls == [checkpoint]

    monkeypatch.setattr(module, "get_checkpoint", lambda: get_checkpoint(None))
    with session.restored_checkpoint() as path:
        assert path is None  # a fresh start
    assert calls == [checkpoint, None]


def test_local_session_resumes_from_the_directory_it_was_given(tmp_path: Path) -> None:
    with LocalSession(resume_from=tmp_path).restored_checkpoint() as path:
        assert path == tmp_path
    with LocalSession().restored_checkpoint() as path:
        assert path is None


def test_the_tune_session_refuses_a_result_without_the_metric_before_tune_sees_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a result without val_loss would end the whole sweep in Tune's metric check; refused here, it fails
    # the trial (`sweeps.trial.run_trial` reports it as `failed`) and the sweep goes on
    from ray import tune

    sent: list[dict] = []
    monkeypatch.setattr(tune, "report", lambda metrics, checkpoint=None: sent.append(metrics))
    monkeypatch.setattr("worker.session.node_id", lambda: "node")  # no Ray runtime here
    with pytest.raises(ValueError, match="a result must carry val_loss"):
        TuneSession().report({"tokens": 64, "status": "diverged", "done": True})
    assert sent == []
    TuneSession().report({"tokens": 64, "status": "diverged", "done": True, "val_loss": float("nan")})
    assert len(sent) == 1 and "val_loss" in sent[0]
