"""Fixtures of the worker tests."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
import torch

_merit_cpu = importlib.import_module("worker.optim._merit_cpu")


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the calls of MERIT's fused CPU kernel's passes from here on (pass 2 runs only when pass 1
    found every |w| and |u| finite)."""
    calls = {"pass1": 0, "pass2": 0}
    for name in calls:
        real = getattr(_merit_cpu, name)

        def counted(*args, _real=real, _name=name, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(_merit_cpu, name, counted)
    return calls


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread for the test, then as it was."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
