"""Several EPP replicas behind one Envoy, as a Deployment with `replicas: N` looks to the gateway.

DESIGN.md §4: replicas are active-active, each keeps its own datastore from the same watches, Envoy
spreads ext_proc streams over them with health checks, and a replica drains (NOT_SERVING first) on
SIGTERM. `EppReplicas` takes a running `Stack` (its pods, pool, models and first EPP), starts more
EPP processes for the same pool with the same flags and certificate (`EppProcess.replica`), and an
Envoy of its own whose ext_proc cluster lists every replica, checks each one's gRPC health port and
retries a stream that could not start on another replica (`harness.dataplane.envoy.ExtProcHealthCheck`,
`EnvoyOptions.ext_proc_retries`). The Stack's own Envoy is left alone. The fault tests and
`benchmarks/bench_epp_faults.py` kill and drain replicas under load here.

Any EPP (a Stack with ``epp_command``): its replicas are more processes of that command
(`ForeignEpp.replica`), and its Envoy speaks the command's protocol. ``wait_serving=False`` starts
the replicas without waiting for each to be SERVING: under ``--ha-enable-leader-election`` only the
Lease holder ever is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.base.lifecycle import StartStop
from harness.beds.stack import NoDatastoreView, Stack
from harness.dataplane.envoy import Envoy, ExtProcHealthCheck, ExtProcReplica
from harness.subject.epp_process import EppProcess
from harness.subject.foreign_epp import ForeignEpp
from harness.verdicts.observer import EppObserver
from harness.verdicts.oracle import Verdict

DEFAULT_HEALTH_CHECK = ExtProcHealthCheck(interval_s=0.5, timeout_s=1.0)


class EppReplicas(StartStop):
    """`count` EPP processes for the Stack's pool (the Stack's own EPP is replica 0) behind one Envoy."""

    def __init__(
        self,
        stack: Stack,
        count: int = 2,
        *,
        health_check: ExtProcHealthCheck = DEFAULT_HEALTH_CHECK,
        retries: int = 1,
        wait_serving: bool = True,
    ) -> None:
        if stack.epp_process is None or stack.cluster is None:
            raise RuntimeError("the Stack is not started")
        if count < 1:
            raise ValueError("at least one replica")
        self.stack = stack
        self.count = count
        self.wait_serving = wait_serving
        envoy = stack.options.envoy
        if stack.options.epp_command is not None:
            envoy = stack.options.epp_command.envoy_options(envoy)
        self.envoy_options = dataclasses.replace(
            envoy, ext_proc_health_check=health_check, ext_proc_retries=retries
        )
        self.replicas: list[EppProcess | ForeignEpp] = [stack.epp_process]
        self.envoy: Envoy | None = None

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        first = self.replicas[0]
        for _ in range(self.count - 1):
            replica = first.replica()
            self.replicas.append(replica)
            replica.start()
        for replica in self.replicas if self.wait_serving else ():
            replica.wait_serving()
        endpoints = [ExtProcReplica(r.ext_proc_address, r.health_port) for r in self.replicas]
        self.envoy = Envoy(endpoints, options=self.envoy_options, ext_proc_tls=first.ext_proc_tls)
        self.envoy.start()

    def stop(self) -> None:
        """Stop this Envoy and the replicas started here (the Stack stops its own EPP). Idempotent."""
        try:
            if self.envoy is not None:
                self.envoy.stop()
                self.envoy = None
        finally:
            extra, self.replicas = self.replicas[1:], self.replicas[:1]
            for replica in extra:
                replica.close()

    # ------------------------------------------------------------------ reading
    def ours(self, index: int) -> EppProcess:
        """Replica ``index`` as our `EppProcess` (its debug view, pause/resume); TypeError for another EPP."""
        replica = self.replicas[index]
        if not isinstance(replica, EppProcess):
            raise TypeError(f"replica {index} is {self.stack.epp_name}, not our EppProcess")
        return replica

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of the Envoy in front of every replica."""
        assert self.envoy is not None, "not started"
        return f"{self.envoy.base_url}/v1"

    def observer(self, index: int) -> EppObserver:
        """The Stack's observation part, reading replica `index`'s datastore view."""
        cluster = self.stack.cluster
        assert cluster is not None, "the Stack is not started"
        replica = self.replicas[index]
        if not isinstance(replica, EppProcess):
            raise NoDatastoreView(f"replica {index} ({self.stack.epp_name}) has no /debug/datastore")
        return EppObserver(
            cluster.kube, cluster.namespace, cluster.pool_name, self.stack.settle_barrier,
            replica.datastore_view,
        )  # fmt: skip

    def verdict(self, index: int) -> Verdict:
        """Replica `index`'s datastore against the API server (the consistency oracle)."""
        return self.observer(index).verdict()

    def settled(self, index: int, timeout: float = 15.0) -> dict[str, Any]:
        """The settle barrier against replica `index`: it has applied every write the Stack made."""
        return self.observer(index).settled(timeout)
