"""Per-owner request limits: token buckets for dry runs and submits, a count of open event streams, one
spec read at a time (service.spec_work).

Both answer 429 with Retry-After beyond their limit (the routes raise it). State lives in this process
(one `Limits` per app, made on first use by `service.api.deps.get_limits`): with several service processes
each enforces its own share.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from service.api.errors import ApiError
from service.settings import Settings
from service.spec_work import SpecWork

# How long a client refused an event stream is told to wait: streams end when their sweep does, so
# there is no time at which a slot is known to free up; a few seconds keeps retries cheap.
STREAM_RETRY_AFTER_S = 5
PRUNE_FLOOR = 1024  # a bucket map is pruned of refilled buckets once it holds this many (and then at 2x what stays)


class TokenBucket:
    """`burst` tokens per owner, refilled continuously at one per `refill_s` seconds."""

    def __init__(self, burst: int, refill_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.refill_s, self._clock = burst, refill_s, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # owner -> (tokens, when counted)
        self._prune_at = PRUNE_FLOOR
        self._lock = threading.Lock()

    def take(self, owner: str) -> float:
        """Take one token: 0.0 when there was one, else the seconds until there will be."""
        with self._lock:
            now = self._clock()
            tokens, then = self._buckets.get(owner, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) / self.refill_s)
            if tokens >= 1.0:
                self._buckets[owner] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[owner] = (tokens, now)
                wait = (1.0 - tokens) * self.refill_s
            if len(self._buckets) >= self._prune_at:
                self._prune(now)
            return wait

    def _prune(self, now: float) -> None:
        """Forget the buckets that have refilled: they are what an unknown key gets. Keys are owners or
        client addresses, which anyone can vary; amortised, as the map must double before the next prune."""
        full = [k for k, (tokens, then) in self._buckets.items() if tokens + (now - then) / self.refill_s >= self.burst]
        for key in full:
            del self._buckets[key]
        self._prune_at = max(PRUNE_FLOOR, 2 * len(self._buckets))

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)


class Slots:
    """At most `limit` held at once per owner."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, owner: str) -> Callable[[], None] | None:
        """A release function (idempotent) when a slot was free, else None."""
        with self._lock:
            if self._held.get(owner, 0) >= self.limit:
                return None
            self._held[owner] = self._held.get(owner, 0) + 1
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                left = self._held.get(owner, 0) - 1
                if left > 0:
                    self._held[owner] = left
                else:
                    self._held.pop(owner, None)

        return release

    def held(self, owner: str) -> int:
        with self._lock:
            return self._held.get(owner, 0)


@dataclass(frozen=True)
class Limits:
    dry_runs: TokenBucket
    submits: TokenBucket
    streams: Slots
    # sessions (POST /login) and one-time links (POST /login/once) made per owner: each is a stored row
    sign_ins: TokenBucket
    # reading submitted specs (dry runs, submits, the submit page's check): one at a time per owner
    spec_work: SpecWork = field(default_factory=SpecWork)

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            dry_runs=TokenBucket(settings.dry_run_burst, settings.dry_run_refill_s),
            submits=TokenBucket(settings.submit_burst, settings.submit_refill_s),
            streams=Slots(settings.max_event_streams_per_owner),
            sign_ins=TokenBucket(settings.sign_in_rows_burst, settings.sign_in_rows_refill_s),
        )

    def take_dry_run(self, owner: str) -> None:
        """Count one dry run of `owner`, or raise 429 when its bucket is empty."""
        _take(self.dry_runs, owner, "dry run")

    def take_sign_in(self, owner: str) -> None:
        """Count one session or one-time link made for `owner`, or raise 429 when its bucket is empty."""
        _take(self.sign_ins, owner, "sign-in")

    def take_submit(self, owner: str) -> None:
        """Count one submit of `owner` (before its body is read), or raise 429 when its bucket is empty."""
        _take(self.submits, owner, "submit")

    def open_stream(self, owner: str) -> Callable[[], None]:
        """A stream slot of `owner` (call the result when the stream ends), or raise 429."""
        release = self.streams.acquire(owner)
        if release is None:
            raise ApiError(
                429,
                "too_many_streams",
                f"{owner} has {self.streams.limit} event streams open, the limit; close one or poll GET /sweeps/{{id}}",
                headers={"Retry-After": str(STREAM_RETRY_AFTER_S)},
            )
        return release


def _take(bucket: TokenBucket, owner: str, what: str) -> None:
    wait = bucket.take(owner)
    if wait > 0:
        raise ApiError(
            429,
            f"too_many_{what.replace(' ', '_').replace('-', '_')}s",
            f"{owner} has used its {bucket.burst} {what}s; one more is allowed every "
            f"{bucket.refill_s:g} s (retry in {math.ceil(wait)} s)",
            headers={"Retry-After": str(math.ceil(wait))},
        )
