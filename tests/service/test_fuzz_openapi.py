"""A property-based fuzz of the whole OpenAPI with a valid token: zero 5xx.

schemathesis generates requests for every operation of the served schema (`/openapi.json`, which
documents the SweepSpec body), schema-valid ones and schema-violating ones, and sends them to the app
under uvicorn in a thread (FakeLauncher, no Ray). Bounded: about 200 requests in all, derandomized
(the same requests every run), no example database written (`database=None`, so no .hypothesis/).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.generation.modes import GenerationMode
from svc_helpers import FakeLauncher, ThreadServer, auth

from service.settings import Settings

# requests per operation and mode (schema-valid, schema-violating): ~190 in all, most of them on the
# one operation that parses a document
EXAMPLES = {"POST /sweeps": 40}
EXAMPLES_OTHERS = 8


@pytest.fixture
def server(make_settings: Callable[..., Settings], launcher: FakeLauncher) -> Iterator[ThreadServer]:
    # limits raised so the fuzz reaches validation instead of stopping at 429s
    settings = make_settings(dry_run_burst=10_000, submit_burst=10_000, max_concurrent_per_owner=10_000)
    with ThreadServer(settings, launcher) as s:
        yield s


def test_no_request_gets_a_5xx(server: ThreadServer) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /sweeps",
        "GET /sweeps",
        "GET /sweeps/{sweep_id}",
        "GET /sweeps/{sweep_id}/events",
        "GET /healthz",
    }
    seen: Counter[tuple[str, int]] = Counter()
    server_errors: list[str] = []

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(
                max_examples=EXAMPLES.get(f"{operation.method.upper()} {operation.path}", EXAMPLES_OTHERS),
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(case: schemathesis.Case) -> None:
                response = case.call(base_url=server.url, headers=auth(), timeout=30)
                seen[(f"{case.method} {case.path}", response.status_code)] += 1
                if response.status_code >= 500:
                    server_errors.append(
                        f"{response.status_code} {case.method} {case.formatted_path}: {response.text[:300]}"
                    )
                elif response.status_code >= 400:
                    # every error in the API's shape
                    assert set(response.json()) == {"error"}, response.text[:300]

            try:
                fuzz()
            except hypothesis.errors.Unsatisfiable:
                # nothing to break: an operation without parameters or body (GET /healthz) has no
                # schema-violating requests
                if mode is GenerationMode.POSITIVE or operation.query or operation.path_parameters or operation.body:
                    raise

    assert server_errors == []
    assert sum(seen.values()) >= 100  # the fuzz did run
    # the spec body was parsed and judged, not only refused at the door
    assert seen[("POST /sweeps", 422)] > 0, seen
