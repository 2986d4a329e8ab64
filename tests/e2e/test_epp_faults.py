"""EPP process faults under load through a real Envoy (issue 12, part 3): two EPP replicas behind one
Envoy that health-checks them (`harness.beds.epp_replicas.EppReplicas`), 32 requests in flight all along
(`harness.dataplane.closed_loop.ClosedLoopLoad`).

* SIGTERM drains a replica: gRPC health goes NOT_SERVING while the process still serves, Envoy stops
  opening streams there, the streams in flight finish, the process exits by itself: no request fails.
* SIGKILL costs at most the requests in flight (their ext_proc streams die with the process; new
  streams are retried on the other replica); restarted, the replica rebuilds its datastore from the
  API server and Envoy routes through it again.

How many requests each fault costs, and how fast a restarted replica is back, are printed by
`benchmarks/bench_epp_faults.py`; these tests assert the behaviour.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.base.eventually import eventually
from harness.beds.epp_replicas import EppReplicas
from harness.beds.stack import BASE_MODEL
from harness.cluster.releases import session_generation
from harness.dataplane.closed_loop import ClosedLoopLoad
from harness.plugin.stack_fixtures import StackFactory
from harness.sim import SimConfig
from harness.subject.epp_process import EppProcess

pytestmark = pytest.mark.e2e

IN_FLIGHT = 32
# A short request takes a few hundred milliseconds, so a fault always finds streams in flight.
SIM = SimConfig(model=BASE_MODEL, max_num_seqs=64, time_scale=0.5)
SHORT_TOKENS = 100
# About 4 s: longer than the drain delay, so the streams a draining replica holds when it stops
# accepting new ones must still finish (they fail if it does not wait for them).
LONG_TOKENS = 1300
# Longer than Envoy's health check needs to see NOT_SERVING (0.5 s interval, 1 failure), with room
# for a loaded machine.
SHUTDOWN_DELAY = datetime.timedelta(seconds=2)
LOG_CLOCK_STEP = datetime.timedelta(milliseconds=10)
# What the replica logs when it turns NOT_SERVING, and when it stops accepting ext_proc streams.
DRAINING = "draining: health NOT_SERVING"
REFUSING = "draining: refusing new ext_proc streams"
TIMEOUT_S = 60.0


def short_request(client: int) -> dict[str, Any]:
    return {"model": BASE_MODEL, "prompt": f"client {client}", "max_tokens": SHORT_TOKENS}


def long_request(client: int) -> dict[str, Any]:
    return {"model": BASE_MODEL, "prompt": f"client {client}", "max_tokens": LONG_TOKENS}


@pytest.fixture
def replicas(stack_factory: StackFactory) -> Iterator[EppReplicas]:
    stack = stack_factory(
        pods=4, sim_config=SIM, epp_args=[f"--shutdownDelay={SHUTDOWN_DELAY.total_seconds():g}s"]
    )
    with EppReplicas(stack, 2) as replicas:
        yield replicas


def served(load: ClosedLoopLoad, since: float) -> int:
    return sum(1 for o in load.outcomes(since) if o.ok)


def steady(load: ClosedLoopLoad, since: float, count: int = 2 * IN_FLIGHT) -> None:
    def enough() -> None:
        assert served(load, since) >= count, f"{served(load, since)} requests served"

    eventually(enough, timeout=TIMEOUT_S, message=f"{count} requests served")


def in_flight_on(replica: EppProcess) -> int:
    """Streams open on this replica: requests it routed whose responses have not ended."""
    return sum(int(p["inFlight"]) for p in replica.datastore_view()["pods"])


def routed_by(replica: EppProcess) -> float:
    """How many requests this replica has routed (its own `inference_model_request_total`, in v1
    `inference_objective_request_total`)."""
    family_name = f"{session_generation().request_metrics}_request"
    return sum(
        sample.value
        for family in text_string_to_metric_families(replica.metrics_text())
        if family.name == family_name
        for sample in family.samples
        if sample.name == f"{family_name}_total"
    )


def logged_at(log: str, fragment: str) -> datetime.datetime:
    """When the EPP logged the first line with ``fragment`` (its console format starts with the time)."""
    line = next((line for line in log.splitlines() if fragment in line), None)
    assert line is not None, f"no {fragment!r} in the log\n{log}"
    return datetime.datetime.strptime(line[: len("2006-01-02 15:04:05,000")], "%Y-%m-%d %H:%M:%S,%f")


def test_sigterm_drains_a_replica_without_failing_a_request(replicas: EppReplicas) -> None:
    draining = replicas.ours(0)
    with ClosedLoopLoad(f"{replicas.base_url}/completions", long_request, concurrency=IN_FLIGHT) as load:
        steady(load, 0.0, IN_FLIGHT)
        assert routed_by(draining) > 0, "Envoy spreads streams over both replicas"
        assert draining.pid is not None

        os.kill(draining.pid, signal.SIGTERM)

        def not_serving() -> None:
            assert draining.health() == "NOT_SERVING"

        eventually(not_serving, timeout=TIMEOUT_S, message="health NOT_SERVING", retry_on=(grpc.RpcError,))
        assert draining.running, "NOT_SERVING comes first, while the replica still serves"
        assert in_flight_on(draining) > 0, "the draining replica holds streams that must finish"

        def exited() -> None:
            assert not draining.running, "the replica is still draining"

        eventually(exited, timeout=TIMEOUT_S, message="the drained replica exits by itself")
        log = draining.log_tail(2000)
        assert "endpoint picker stopped" in log, log
        # Load balancers need the delay to notice NOT_SERVING: the replica kept accepting streams at
        # least that long (a bound a slow machine can only make longer; the log's clock is in ms).
        kept_serving = logged_at(log, REFUSING) - logged_at(log, DRAINING)
        assert kept_serving >= SHUTDOWN_DELAY - LOG_CLOCK_STEP, (
            f"new streams refused {kept_serving} after NOT_SERVING\n{log}"
        )
        steady(load, time.monotonic(), IN_FLIGHT)  # the other replica carries on
    failures = load.failures()
    assert failures == [], f"{len(failures)} requests failed, e.g. {failures[0].error}"


def test_sigkill_costs_at_most_the_requests_in_flight_and_a_restart_rebuilds_the_state(
    replicas: EppReplicas,
) -> None:
    victim = replicas.ours(0)
    with ClosedLoopLoad(f"{replicas.base_url}/completions", short_request, concurrency=IN_FLIGHT) as load:
        steady(load, 0.0)
        killed_at = time.monotonic()
        victim.kill()
        steady(load, killed_at)  # the other replica carries the load
        failures = load.failures()
        assert len(failures) <= IN_FLIGHT, f"{len(failures)} failed, more than were in flight"

        victim.start()  # what the kubelet does with a container that died
        victim.wait_serving(timeout=TIMEOUT_S)
        replicas.settled(0, timeout=TIMEOUT_S)
        verdict = replicas.verdict(0)
        assert verdict.consistent, verdict.summary()
        routed_before = routed_by(victim)

        def routes_again() -> None:
            assert routed_by(victim) > routed_before + IN_FLIGHT, "Envoy is not using the restarted replica"

        eventually(routes_again, timeout=TIMEOUT_S, message="Envoy routes through the restarted replica")
        after_restart = time.monotonic()
        steady(load, after_restart, IN_FLIGHT)
    assert load.failures(after_restart) == []
