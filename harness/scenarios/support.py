"""Small helpers shared by the e2e tests: real OpenAI clients on a Stack, and reading where requests went."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx2
import openai
import pytest

from harness.base.eventually import eventually
from harness.beds.cluster import Cluster
from harness.beds.stack import Stack
from harness.sim import SERVED_BY_HEADER
from harness.subject.foreign_epp import EppCommand

DESTINATION_HEADER = "x-gateway-destination-endpoint"
POD_PORT = 8000
# Long enough for a 2 MiB prompt on a loaded 2-core box; tests never assert on durations.
CLIENT_TIMEOUT_S = 60.0


@contextlib.contextmanager
def openai_client(stack: Stack, **options: Any) -> Iterator[openai.OpenAI]:
    """An OpenAI client on the Stack's Envoy. No retries: every status the test sees is the first one.

    In a v1 cluster a request names its InferenceObjective in a header: the client adds the one
    the Stack's cluster applied for the body's model (``Cluster.objective_headers``), as a v1 client
    that wants that criticality would."""
    options.setdefault("max_retries", 0)
    options.setdefault("timeout", CLIENT_TIMEOUT_S)
    if stack.cluster is not None and "http_client" not in options:
        options["http_client"] = httpx2.Client(event_hooks={"request": [_objective_header(stack.cluster)]})
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", **options)
    try:
        yield client
    finally:
        client.close()


def _objective_header(cluster: Cluster) -> Any:
    def add(request: httpx2.Request) -> None:
        try:
            content = request.content
        except httpx2.RequestNotRead:  # a streamed upload: no model to read
            return
        request.headers.update(cluster.objective_headers_of_body(content))

    return add


def error_text(err: openai.APIStatusError) -> str:
    """What the client can read about an error: the OpenAI-style ``error.message``, else the raw body."""
    return _message_of(err.body)


def http_error_text(response: httpx2.Response) -> str:
    """The same, for a raw HTTP response."""
    try:
        body: object = response.json()
    except ValueError:
        body = response.text
    return _message_of(body)


def assert_readable_error(err: openai.APIStatusError, message: str) -> None:
    """The EPP's message reaches the client: in the body, and in the SDK's exception text."""
    body = error_text(err)
    assert body == message, f"{err.status_code} with error body {body!r}, expected {message!r}"
    assert message in str(err), f"the SDK shows only {str(err)!r}"


def _message_of(body: object) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else None
        return message if isinstance(message, str) else str(body)
    return body if isinstance(body, str) else ""


def endpoint(stack: Stack, pod: str) -> str:
    """``ip:port`` of a simulated pod, as Envoy's access log and the EPP's pick spell it."""
    return f"{cluster_of(stack).pods[pod].ip}:{POD_PORT}"


def served_by(headers: Any) -> str:
    """The simulator that answered (``x-served-by``), from an httpx-style headers mapping."""
    value = headers.get(SERVED_BY_HEADER)
    assert value, f"no {SERVED_BY_HEADER} header: the response did not come from a simulator"
    return str(value)


def cluster_of(stack: Stack) -> Cluster:
    assert stack.cluster is not None, "the Stack is not started"
    return stack.cluster


def wait_routable(stack: Stack, pods: Sequence[str], timeout: float = 15.0) -> None:
    """Settle, then until the EPP's datastore holds exactly ``pods``, each with metrics scraped, and
    a list-aware gateway holds their endpoints too (`Stack.wait_gateway_follows_pool`).

    Settling first makes "exactly" mean something for the pods that must NOT be there: the EPP has
    applied every pod write the test made, so a pod it would wrongly add is already in the view.

    An EPP without that view (``--epp-command``): the traffic oracle instead, until one round of
    requests lands on exactly ``pods`` (`harness.verdicts.traffic_oracle`: each routable pod is seen with
    probability >= 1 - 1e-5 per round).
    """
    if not stack.white_box:
        assert stack.traffic is not None, "the Stack is not started"
        stack.traffic.eventually_routes_to(pods, timeout=max(timeout, 30.0))
        return
    stack.settled(timeout=timeout)

    def check() -> None:
        view = stack.datastore_view().get("pods") or []
        assert sorted(p["name"] for p in view) == sorted(pods), f"EPP holds {[p['name'] for p in view]}"
        unscraped = [p["name"] for p in view if p.get("metricsAgeSeconds") is None]
        assert not unscraped, f"not scraped yet: {unscraped}"

    eventually(check, timeout=timeout, message=f"EPP routes to exactly {sorted(pods)}")
    stack.wait_gateway_follows_pool(timeout)


def wait_queues_seen(stack: Stack, queues: Mapping[str, int], timeout: float = 15.0) -> None:
    """Until the EPP's datastore holds each pod's pinned waiting queue (``{pod: waiting}``).

    `wait_routable` waits for a first scrape, which may predate gauges pinned just after the pod came
    up: a test whose ranking rests on them waits for the scraped values themselves.
    """
    assert stack.white_box, "the EPP under test has no datastore view"

    def check() -> None:
        pods = {p["name"]: p for p in stack.datastore_view().get("pods") or []}
        seen = {name: (pods.get(name) or {}).get("metrics", {}).get("waitingQueueSize") for name in queues}
        assert seen == dict(queues), f"the EPP sees queues {seen}"

    eventually(check, timeout=timeout, message=f"the EPP sees the queues {dict(queues)}")


def settled_access_log(stack: Stack, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The access log once it holds every request Envoy has completed (Envoy flushes every 100 ms)."""

    def settled() -> list[dict[str, Any]]:
        assert stack.envoy is not None
        completed = envoy_counter(stack, "http.ingress.downstream_rq_completed")
        log = stack.envoy.access_log()
        assert len(log) == completed, f"{len(log)} access-log entries for {completed} completed requests"
        return log

    return eventually(settled, timeout=timeout, message="Envoy flushed the access log")


def access_log_since(stack: Stack, start: int) -> list[dict[str, Any]]:
    """Entries of requests completed after the log held ``start`` entries (see ``settled_access_log``)."""
    return settled_access_log(stack)[start:]


def envoy_counter(stack: Stack, name: str) -> int:
    assert stack.envoy is not None
    pattern = urllib.parse.quote(f"^{re.escape(name)}$")
    url = f"{stack.envoy.admin_url}/stats?format=json&filter={pattern}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        stats = json.load(resp)["stats"]
    [value] = [s["value"] for s in stats if s.get("name") == name]
    return int(value)


def requests_by_model(stack: Stack) -> dict[str, dict[str, int]]:
    """Per pod name: what its simulator accepted, by requested model name (base or adapter)."""
    return {name: dict(pod.sim(POD_PORT).requests_by_model()) for name, pod in cluster_of(stack).pods.items()}


def total_requests(stack: Stack) -> int:
    return sum(sum(counts.values()) for counts in requests_by_model(stack).values())


def skip_unless_two_can_run(epp_command: EppCommand | None) -> None:
    """Skip, as not applicable, a scenario that runs two of the EPP under test on this host at once
    (a Stack per pool) when that EPP always binds fixed ports (upstream v0.3.0's :8080)."""
    if epp_command is not None and epp_command.fixed_ports:
        pytest.skip(
            f"not applicable: {epp_command.name} always binds port(s) {epp_command.fixed_ports}, so two "
            "of it (one per pool) cannot run on one host"
        )
