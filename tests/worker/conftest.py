"""Fixtures of the worker tests."""

from __future__ import annotations

import importlib

import pytest

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
