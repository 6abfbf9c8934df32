"""service.spec_work.SpecWork: one spec at a time per owner, and no owner kept once their work is done."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from service.spec_work import SpecWork


def test_one_owner_at_a_time_and_nobody_kept_after() -> None:
    work = SpecWork(threads=2)
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    lock = threading.Lock()

    def job(owner: str) -> str:
        with lock:
            running[owner] = running.get(owner, 0) + 1
            most[owner] = max(most.get(owner, 0), running[owner])
        time.sleep(0.02)
        with lock:
            running[owner] -= 1
        return owner

    async def main() -> list[str]:
        done: list[str] = []

        async def one(owner: str) -> None:
            done.append(await work.run(owner, job, owner))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, "alice" if i % 2 else f"owner-{i}")
        return done

    done = anyio.run(main)
    assert len(done) == 12
    assert most["alice"] == 1  # six of alice's, never two at once
    assert work.owners() == 0  # the per-owner turns are dropped once nobody holds or waits


def test_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threads=0"):
        SpecWork(threads=0)
