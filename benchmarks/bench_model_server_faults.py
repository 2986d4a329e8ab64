"""Data-plane faults on model servers: how long a dead or hung server keeps receiving requests.

One control plane of its own (with the node agent); per round a fresh namespace, the in-process EPP
(scrapes every 50 ms, staleness threshold `--staleness`), a Critical model and three pods, one of
them the victim. `--clients` client threads each loop: route one request through the EPP over
ext_proc, then send it where the EPP said (the rewritten body, to the pod's address and port) with a
`--request-timeout`, as Envoy would. After one second of that, the fault:

- killed: a forged pod (no kubelet: a lost node) whose simulator's listener closes — connections
  are refused — while the pod stays Ready in the API;
- black hole: a pod the node agent runs whose simulator accepts connections and never answers
  `/metrics` or generation (sim admin black hole), while `/health` answers, so it stays Ready.

Printed per round: seconds from the fault to the last request routed to the victim (aim: about the
staleness threshold plus one scrape interval), requests routed to the victim after the fault (each
one fails: refused, or the client's timeout), requests failed elsewhere (aim 0), the other pods'
oldest metrics age during the fault (their probing must not suffer), and whether the datastore
equals the oracle at the end. Asserts nothing.

    .venv/bin/python benchmarks/bench_model_server_faults.py [--rounds 3] [--staleness 2.0]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from kubernetes import client

from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ControlPlane

OTHERS = ("p1", "p2")
TARGET_MODEL = "base-model"  # what the simulators serve (harness.beds.cluster.DEFAULT_SIM_CONFIG)
WARMUP_S = 1.0
AFTER_S = 3.0  # past the threshold: long enough to see that nothing goes to the victim any more


@dataclass
class Outcome:
    started: float
    pod: str | None
    ok: bool


@dataclass
class Round:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    others_max_age: float = 0.0


def send(bed: TestBed, timeout: float) -> Outcome:
    started = time.monotonic()
    result = bed.route("chat")
    if result.status != 200 or result.endpoint is None:
        return Outcome(started, None, False)
    pod = bed.pod_for_endpoint(result.endpoint)
    body = result.body or json.dumps({"model": "chat", "prompt": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{result.endpoint}/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return Outcome(started, pod, response.status == 200)
    except OSError:
        return Outcome(started, pod, False)


def run_round(
    api: client.ApiClient, plane: ControlPlane, fault: str, n: int, args: argparse.Namespace
) -> tuple[str, float]:
    namespace = f"msfault-{fault.replace(' ', '-')}-{n}-{int(time.time())}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace.model_validate({"metadata": {"name": namespace}}), _preload_content=False
    )
    forged = fault == "killed"
    try:
        with TestBed(api, namespace, plane.kubeconfig_path, staleness_threshold=args.staleness) as bed:
            bed.start_epp()
            bed.apply_pool()
            bed.apply_model("chat", criticality="Critical", targets=[(TARGET_MODEL, 100)])
            for name in ("victim", *OTHERS):
                (bed.add_forged_pod if forged else bed.add_pod)(name)
            bed.eventually_consistent(timeout=60)
            bed.eventually_scraped(timeout=30)
            record = Round()
            stop = threading.Event()

            def client_loop() -> None:
                while not stop.is_set():
                    outcome = send(bed, args.request_timeout)
                    with record.lock:
                        record.outcomes.append(outcome)

            threads = [threading.Thread(target=client_loop, name=f"client-{i}") for i in range(args.clients)]
            for thread in threads:
                thread.start()
            try:
                time.sleep(WARMUP_S)
                fault_at = time.monotonic()
                if forged:
                    bed.forged_server_dies("victim")
                else:
                    bed.pod_stop_serving("victim")
                while time.monotonic() < fault_at + args.staleness + AFTER_S:
                    for name in OTHERS:
                        age = (bed.pod_view(name) or {}).get("metricsAgeSeconds")
                        record.others_max_age = max(record.others_max_age, age if age is not None else 1e9)
                    time.sleep(0.05)
            finally:
                stop.set()
                for thread in threads:
                    thread.join()
            consistent = bed.eventually_consistent(timeout=60).consistent
    finally:
        client.CoreV1Api(api).delete_namespace(namespace, _preload_content=False)
    after = [o for o in record.outcomes if o.started >= fault_at]
    to_victim = [o for o in after if o.pod == "victim"]
    last = max((o.started for o in to_victim), default=fault_at) - fault_at
    failed_elsewhere = sum(1 for o in after if o.pod != "victim" and not o.ok)
    before = [o for o in record.outcomes if o.started < fault_at]
    failed_before = sum(not o.ok for o in before)
    return (
        f"{fault:10} round {n}: last routed to the victim {last:5.2f} s after the fault; "
        f"{len(to_victim)} requests sent to it (failed {sum(not o.ok for o in to_victim)}), "
        f"{failed_elsewhere} failed elsewhere, of {len(after)} after the fault ({len(before)} before: "
        f"{sum(o.pod == 'victim' for o in before)} to the victim, {failed_before} failed); other pods' "
        "metrics at most "
        f"{record.others_max_age:.2f} s old; datastore = oracle: {consistent}"
    ), last


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--staleness", type=float, default=2.0, help="the EPP's staleness threshold, s")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--request-timeout", type=float, default=1.0)
    parser.add_argument("--only", choices=["killed", "black hole"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    faults = [args.only] if args.only else ["killed", "black hole"]
    with ControlPlane() as plane, plane.api_client() as api:
        print(f"model-server faults: staleness threshold {args.staleness} s, scrapes every 0.05 s, "
              f"{args.clients} clients, request timeout {args.request_timeout} s")  # fmt: skip
        for fault in faults:
            lasts = []
            for n in range(args.rounds):
                line, last = run_round(api, plane, fault, n, args)
                lasts.append(last)
                print(line, flush=True)
            print(f"{fault}: last routed {min(lasts):.2f}-{max(lasts):.2f} s after the fault "
                  f"(median {statistics.median(lasts):.2f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
