"""EPP process faults under load: requests failed by a SIGTERM and by a SIGKILL of one EPP replica,
and how fast a restarted replica has rebuilt its state.

A private control plane (etcd + kube-apiserver), a `Stack` (4 simulated pods, the demo's models) and
`harness.beds.epp_replicas.EppReplicas`: two EPP processes behind one Envoy that health-checks each
(gRPC health every 0.5 s) and retries a stream that could not start on the other. A closed-loop load
keeps `--in-flight` requests (each a few hundred ms) in flight through Envoy the whole time. Then:

- SIGTERM replica 0 and keep the load on until it has exited; count failed requests (aim 0). The
  replica drains: NOT_SERVING at once, `--shutdownDelay` more serving, then no new streams and the
  open ones finish. The drain time (SIGTERM to exit) is printed too.
- restart it; the time from exec to SERVING with a datastore equal to the oracle and every pod
  scraped ("state rebuilt", aim <= 2 s).
- SIGKILL replica 0 under the same load; count failed requests (aim <= requests in flight) and
  print how many requests were in flight at the kill.
- restart it again, timed the same way.

`--compare` adds the same SIGTERM without the drain (`--shutdownDelay=0s`, no Envoy retries), which
is what the EPP did before it drained.

    .venv/bin/python benchmarks/bench_epp_faults.py [--in-flight 32] [--rounds 3] [--compare]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from harness.beds.epp_replicas import EppReplicas
from harness.beds.stack import BASE_MODEL, Stack, StackOptions
from harness.cluster.controlplane import MINIMAL, ClusterAccess, ControlPlane
from harness.dataplane.closed_loop import ClosedLoopLoad
from harness.sim import SimConfig

NAMESPACE = "bench-epp-faults"
SIM = SimConfig(model=BASE_MODEL, max_num_seqs=64, time_scale=0.5)
MAX_TOKENS = 100
STEADY_S = 3.0
POLL_S = 0.01
TIMEOUT_S = 120.0


def request(client_id: int) -> dict[str, Any]:
    return {"model": BASE_MODEL, "prompt": f"client {client_id}", "max_tokens": MAX_TOKENS}


@contextmanager
def running(
    access: ClusterAccess, namespace: str, shutdown_delay: str, retries: int
) -> Iterator[EppReplicas]:
    """A Stack in its own namespace (it creates it) and two replicas behind Envoy."""
    delay = f"--shutdownDelay={shutdown_delay}"
    options = StackOptions(namespace=namespace, pods=4, sim_config=SIM, epp_args=[delay])
    with Stack(access, options) as stack, EppReplicas(stack, 2, retries=retries) as replicas:
        yield replicas


def in_flight_at(load: ClosedLoopLoad, moment: float) -> int:
    return sum(1 for o in load.outcomes() if o.started <= moment <= o.ended)


def wait_exited(replicas: EppReplicas, index: int) -> float:
    deadline = time.monotonic() + TIMEOUT_S
    while replicas.ours(index).running:
        if time.monotonic() > deadline:
            raise TimeoutError("the replica did not exit")
        time.sleep(POLL_S)
    return time.monotonic()


def rebuilt_in(replicas: EppReplicas, index: int) -> float:
    """Exec to SERVING, datastore = oracle and every pod scraped, polled every 10 ms."""
    replica = replicas.ours(index)
    replica.stop()  # reap what is left (a drained or killed process)
    started = time.monotonic()
    replica.start(timeout=TIMEOUT_S)
    pods = len(replicas.stack.cluster.pods) if replicas.stack.cluster else 0
    deadline = started + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if replica.health() == "SERVING" and replicas.verdict(index).consistent:
                view = replica.datastore_view()
                if sum(1 for p in view["pods"] if p.get("metricsAgeSeconds") is not None) == pods:
                    return time.monotonic() - started
        except Exception:  # not listening yet
            pass
        time.sleep(POLL_S)
    raise TimeoutError("the restarted replica did not rebuild its state")


def sigterm_round(replicas: EppReplicas, in_flight: int) -> dict[str, float]:
    url = f"{replicas.base_url}/completions"
    victim = replicas.ours(0)
    with ClosedLoopLoad(url, request, concurrency=in_flight) as load:
        time.sleep(STEADY_S)
        assert victim.pid is not None
        signalled = time.monotonic()
        os.kill(victim.pid, signal.SIGTERM)
        exited = wait_exited(replicas, 0)
        time.sleep(1.0)
    return {
        "failed": len(load.failures()),
        "requests": len(load.outcomes()),
        "in flight at signal": in_flight_at(load, signalled),
        "drain s": exited - signalled,
        "rebuilt s": rebuilt_in(replicas, 0),
    }


def sigkill_round(replicas: EppReplicas, in_flight: int) -> dict[str, float]:
    url = f"{replicas.base_url}/completions"
    victim = replicas.ours(0)
    with ClosedLoopLoad(url, request, concurrency=in_flight) as load:
        time.sleep(STEADY_S)
        assert victim.pid is not None
        killed = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        time.sleep(STEADY_S)
    return {
        "failed": len(load.failures()),
        "requests": len(load.outcomes()),
        "in flight at signal": in_flight_at(load, killed),
        "rebuilt s": rebuilt_in(replicas, 0),
    }


def _figure(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.2f}"


def print_rows(title: str, rounds: list[dict[str, float]]) -> None:
    keys = list(rounds[0])
    cells = []
    for key in keys:
        values = [r[key] for r in rounds]
        each = " ".join(_figure(v) for v in values)
        cells.append(f"{key}: {each} (median {_figure(statistics.median(values))})")
    print(f"  {title}")
    for cell in cells:
        print(f"      {cell}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=int, default=32, help="requests kept in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shutdown-delay", default="3s", help="the replicas' --shutdownDelay")
    parser.add_argument("--compare", action="store_true", help="also SIGTERM without the drain")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    with ControlPlane(components=MINIMAL) as plane:
        print(f"2 EPP replicas behind Envoy, {args.in_flight} requests in flight, {args.rounds} rounds\n")
        with running(plane.access, NAMESPACE, args.shutdown_delay, retries=1) as replicas:
            terms = [sigterm_round(replicas, args.in_flight) for _ in range(args.rounds)]
            kills = [sigkill_round(replicas, args.in_flight) for _ in range(args.rounds)]
        print_rows(f"SIGTERM (drain: --shutdownDelay={args.shutdown_delay}; aim 0 failed)", terms)
        print_rows("SIGKILL (aim: failed <= in flight)", kills)
        if args.compare:
            with running(plane.access, f"{NAMESPACE}-bare", "0s", retries=0) as replicas:
                bare = [sigterm_round(replicas, args.in_flight) for _ in range(args.rounds)]
            print_rows("SIGTERM without the drain (--shutdownDelay=0s, no Envoy retries)", bare)


if __name__ == "__main__":
    main()
