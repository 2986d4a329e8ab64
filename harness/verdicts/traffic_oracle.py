"""The black-box consistency oracle: which pods an EPP routes to, decided from traffic alone.

An EPP under test (upstream's, anyone's) has no ``/debug/datastore``; what it holds shows only in
where requests go. This oracle sends requests through Envoy and reads, from each simulated pod's own
request counter (its admin port, ``harness.sim.SimAdmin``), which pods received them. The members it
expects are computed from the API server alone, by the same rules as the white-box oracle
(``harness.verdicts.oracle.expected_state``: in the pool's namespace, selected, Ready, addressed, not being
deleted). A check passes when, within one round of ``N`` requests, every member received at least
one request, no other pod received any, and every request was answered by a pod (or, with no
members, none was). ``eventually_routes_to`` repeats rounds until one passes (the EPP converges in
its own time): no fixed pause anywhere.

How big ``N`` is, and what a pass or a miss means. A round is only evidence if a member that is
routable would very likely have been picked. Both our EPP and upstream's v0.3.0 filter the
candidates on their gauges and then pick uniformly at random among the survivors
(epp-behaviour.md §5); with the pods idle — this oracle sends one short request at a time, each with
a fresh prompt so no prefix affinity builds up — every routable pod survives every filter. We do not
rely on exact uniformity: we assume only that each routable pod is picked with probability at least
``share / k`` per request (``k`` routable pods, ``share`` = 1/2 by default: a picker up to twice as
unfair as uniform). Then, for one routable pod, P(no request in N) <= (1 - share/k)^N <= exp(-share·N/k),
and over all k pods (union bound) P(some routable pod is missed) <= k·exp(-share·N/k) <= ``alpha``
when ``N = ceil(k/share · ln(k/alpha))``. ``k`` is taken as every pod of the test's cluster that could
be routable (members and non-members alike), so the same bound covers both directions: a member the
EPP routes to is seen, and a non-member the EPP wrongly keeps routable (the bug a terminating pod
makes) is seen too, each with probability >= 1 - alpha per round. With alpha = 1e-5: k=1 -> 24,
k=2 -> 50, k=4 -> 114 requests. A test that pins gauges so that one pod must win needs no such bound
(it expects one member; any request elsewhere is a violation).
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import httpx2

from harness.base.eventually import eventually
from harness.cluster.kube import Kube
from harness.sim import SERVED_BY_HEADER, SimAdmin
from harness.verdicts.oracle import expected_from_api

DEFAULT_ALPHA: Final = 1e-5
DEFAULT_SHARE: Final = 0.5
REQUEST_TIMEOUT_S: Final = 60.0


def requests_needed(candidates: int, *, alpha: float = DEFAULT_ALPHA, share: float = DEFAULT_SHARE) -> int:
    """``N`` such that ``candidates`` pods, each picked with probability >= share/candidates, are all
    seen within N requests except with probability <= alpha (module docstring)."""
    k = max(1, candidates)
    return math.ceil(k / share * math.log(k / alpha))


@dataclass(frozen=True)
class TrafficVerdict:
    """One round: what was expected, what each pod received, how the requests were answered."""

    expected: frozenset[str]
    received: Mapping[str, int]  # pod name -> requests its simulator counted in this round
    statuses: Mapping[int, int]  # HTTP status -> how many
    sent: int
    model: str
    served_by_unknown: int = 0  # answered by a simulator that is not one of the cluster's pods
    differences: Sequence[str] = field(default_factory=tuple)

    @property
    def consistent(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        got = ", ".join(f"{pod}={n}" for pod, n in sorted(self.received.items()) if n) or "no pod"
        statuses = ", ".join(f"{status}x{n}" for status, n in sorted(self.statuses.items()))
        head = (
            f"sent {self.sent} x POST /v1/completions model={self.model!r}; answered {statuses}; "
            f"pods that got traffic: {got}; expected members: {sorted(self.expected) or 'none'}"
        )
        return head if self.consistent else f"{head}; INCONSISTENT: {'; '.join(self.differences)}"


class PodWithSim(Protocol):
    def sim(self, port: int | None = None) -> SimAdmin: ...


class ObservedCluster(Protocol):
    """What the oracle reads of the test's cluster (``harness.beds.cluster.Cluster`` is one): the API
    it judges membership by, and the pods whose simulators count what they served."""

    @property
    def kube(self) -> Kube: ...
    @property
    def namespace(self) -> str: ...
    @property
    def pool_name(self) -> str: ...
    @property
    def pods(self) -> Mapping[str, PodWithSim]: ...
    def pod_for_endpoint(self, endpoint: str | None) -> str | None: ...


class TrafficOracle:
    """Membership of the EPP's routing set, from traffic through ``base_url`` (Envoy's ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        cluster: ObservedCluster,
        model: str | None,
        *,
        alpha: float = DEFAULT_ALPHA,
        share: float = DEFAULT_SHARE,
    ) -> None:
        self.base_url = base_url
        self.cluster = cluster
        self.model = model
        self.alpha = alpha
        self.share = share
        self.rounds: list[TrafficVerdict] = []  # every round, for a failure's evidence

    def expected_members(self) -> frozenset[str]:
        """Pod names the EPP must route to, computed from the API server (``harness.verdicts.oracle``)."""
        state = expected_from_api(self.cluster.kube, self.cluster.namespace, self.cluster.pool_name)
        return frozenset(key.split("/", 1)[1] for key in state.pods)

    def probe(self, members: Collection[str] | None = None, requests: int | None = None) -> TrafficVerdict:
        """One round of ``requests`` (default: the bound's N) and its verdict against ``members``
        (default: ``expected_members()``)."""
        if self.model is None:
            raise ValueError(
                "no model to probe with: no model is served as the base model (StackOptions.probe_model)"
            )
        expected = frozenset(self.expected_members() if members is None else members)
        candidates = set(self.cluster.pods) | expected
        count = (
            requests
            if requests is not None
            else requests_needed(len(candidates), alpha=self.alpha, share=self.share)
        )
        before = self._counts()
        statuses: Counter[int] = Counter()
        unknown = 0
        with httpx2.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_S) as http:
            for _ in range(count):
                response = http.post(
                    "/completions",
                    json={
                        "model": self.model,
                        "prompt": f"membership probe {uuid.uuid4().hex}",
                        "max_tokens": 1,
                    },
                )
                statuses[response.status_code] += 1
                served = response.headers.get(SERVED_BY_HEADER)
                if served and self.cluster.pod_for_endpoint(served) is None:
                    unknown += 1
        after = self._counts()
        received = {pod: after.get(pod, 0) - before.get(pod, 0) for pod in after}
        verdict = _judge(expected, received, statuses, count, str(self.model), unknown)
        self.rounds.append(verdict)
        return verdict

    def eventually_routes_to(
        self, members: Collection[str] | None = None, *, timeout: float = 30.0
    ) -> TrafficVerdict:
        """Rounds until one is consistent with ``members`` (default: the API server's view, re-read each
        round); AssertionError naming the last round's evidence after ``timeout``."""

        def check() -> TrafficVerdict:
            verdict = self.probe(members)
            assert verdict.consistent, verdict.summary()
            return verdict

        want = "the API server's members" if members is None else sorted(members)
        return eventually(check, timeout=timeout, message=f"the EPP routes to exactly {want}")

    def _counts(self) -> dict[str, int]:
        """Requests each of the cluster's pods has counted so far (a pod whose simulator is gone: absent)."""
        counts: dict[str, int] = {}
        for name, pod in list(self.cluster.pods.items()):
            try:
                counts[name] = sum(pod.sim().requests_by_model().values())
            except OSError:
                continue
        return counts


def _judge(
    expected: frozenset[str],
    received: Mapping[str, int],
    statuses: Counter[int],
    sent: int,
    model: str,
    unknown: int,
) -> TrafficVerdict:
    differences = []
    missing = sorted(expected - {pod for pod, n in received.items() if n})
    if missing:
        differences.append(f"members that got no request in {sent}: {missing}")
    extra = sorted(pod for pod, n in received.items() if n and pod not in expected)
    if extra:
        differences.append(f"non-members that got traffic: {', '.join(f'{p}={received[p]}' for p in extra)}")
    if unknown:
        differences.append(f"{unknown} requests answered by a simulator that is no pod of the pool")
    failed = sum(n for status, n in statuses.items() if status != 200)
    if expected and failed:
        differences.append(f"{failed} of {sent} requests failed with members to route to")
    if not expected and statuses.get(200):
        differences.append(f"{statuses[200]} requests answered 200 with no member to route to")
    return TrafficVerdict(expected, dict(received), dict(statuses), sent, model, unknown, tuple(differences))
