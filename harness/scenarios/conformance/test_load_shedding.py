"""Under saturation the EPP keeps serving Critical traffic and sheds the rest with 429.

Saturation is reported, not produced: every simulator pins its gauges to a queue of 10 and a KV cache
90% full (above the sheddable thresholds, queue <= 5 and KV <= 80%, but under the 128 of "low
queueing" that Critical traffic is judged by). The module's one Stack is saturated once; each case
only sends requests.
"""

from __future__ import annotations

import openai
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, Stack
from harness.scenarios.support import (
    access_log_since,
    assert_readable_error,
    cluster_of,
    endpoint,
    openai_client,
    served_by,
    settled_access_log,
)

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic, pytest.mark.needs("load-shedding")]

SATURATED_QUEUE = 10
SATURATED_KV = 0.9
REQUESTS_PER_CASE = 5


@pytest.fixture(scope="module")
def saturated(shared_stack: Stack) -> Stack:
    cluster = cluster_of(shared_stack)
    for name in cluster.pods:
        cluster.set_gauges(name, waiting=SATURATED_QUEUE, kv_cache=SATURATED_KV)

    def every_pod_reports_saturation() -> None:
        pods = shared_stack.datastore_view().get("pods") or []
        assert len(pods) == len(cluster.pods)
        for pod in pods:
            metrics = pod["metrics"]
            assert metrics["waitingQueueSize"] == SATURATED_QUEUE, pod
            assert metrics["kvCacheUsagePercent"] == pytest.approx(SATURATED_KV), pod

    def a_sheddable_request_is_shed() -> None:
        with openai_client(shared_stack) as client:
            try:
                reply = client.completions.create(model="summaries-batch", prompt="probe", max_tokens=1)
            except openai.RateLimitError:
                return
        raise AssertionError(
            f"a sheddable request was served (as {reply.model}): some pod not seen saturated"
        )

    # Our EPP shows its view; any other EPP only shows that it sheds (which it does only once it has
    # seen every pod saturated: a pod it still saw idle would serve the request).
    check = every_pod_reports_saturation if shared_stack.white_box else a_sheddable_request_is_shed
    eventually(check, message="the EPP sees every pod saturated")
    return shared_stack


@pytest.mark.parametrize(
    ("model", "target"),
    [
        pytest.param("food-review", {"food-review-1", "food-review-2"}, id="critical-weighted-split"),
        pytest.param("sql-lora", {"sql-lora-v1"}, id="critical-lora"),
    ],
)
def test_critical_request_is_served(saturated: Stack, model: str, target: set[str]) -> None:
    pods = {endpoint(saturated, name) for name in cluster_of(saturated).pods}
    with openai_client(saturated) as client:
        for _ in range(REQUESTS_PER_CASE):
            raw = client.completions.with_raw_response.create(model=model, prompt="urgent", max_tokens=1)
            assert served_by(raw.headers) in pods
            assert raw.parse().model in target


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("summaries-batch", id="sheddable"),
        pytest.param(BASE_MODEL, id="standard"),
    ],
)
@pytest.mark.departure("readable-error-bodies")
def test_non_critical_request_is_shed_with_429(saturated: Stack, model: str) -> None:
    log_start = len(settled_access_log(saturated))
    with openai_client(saturated) as client:
        for _ in range(REQUESTS_PER_CASE):
            with pytest.raises(openai.RateLimitError) as caught:
                client.completions.create(model=model, prompt="whenever", max_tokens=1)
            assert caught.value.status_code == 429
            assert_readable_error(caught.value, "dropping request due to limited backend resources")

    entries = access_log_since(saturated, log_start)
    assert [e["status"] for e in entries] == [429] * REQUESTS_PER_CASE
    assert all(e["upstream_host"] is None for e in entries), "a shed request never reaches a pod"
