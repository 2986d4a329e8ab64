"""The settle barrier (DESIGN.md §3, STYLE habit 20): a negative check may run only once the EPP has
applied every write that could make it fail.

"Nothing changed" holds trivially in the instant after a write, whether or not the EPP would get it
wrong a moment later. So before such a check the test settles: `SettleBarrier.wait` reads the EPP's
`/debug/datastore` until, for each watched kind, the EPP has *applied* (received and reconciled) at
least the newest write the test made that it can see, and every kind is idle (nothing queued, in
flight, or waiting to be retried). A check made after that sees everything the EPP will ever do
about those writes.

What is recorded. `record(plural, object)` is called with the answer of every write
(`harness.cluster.kube.Kube`'s `on_write`): the object as the write left it, carrying the write's
resourceVersion (a delete's own revision included; kube.py explains how). Writes made some other
way — kubectl in the e2e tests — are declared with `wait(..., at={"pods": "1234"})`.

Comparing resourceVersions as integers. The Kubernetes API calls resourceVersions opaque strings,
only to be compared for equality. The harness owns its API server (kube-apiserver on etcd3, and
`harness replay --kubeconfig` assumes the same of the cluster it is given), where a resourceVersion
is the etcd revision of the write: one counter for the whole store, growing with every write. So
"the EPP applied at least what the test wrote" is `int(applied) >= int(written)` — here, and
nowhere in the EPP, which keeps treating versions as opaque.

Scope: which writes the EPP can see. A write outside the EPP's watches never reaches it, and its
watch's resourceVersion only moves with events it can see, so waiting for such a write would wait
for ever. The barrier takes the scope from the EPP itself: each entry of the view's `watches` says
which namespace it watches and with which selectors (our EPP: its pool's namespace for all three
kinds, and for pools only `metadata.name=<its pool>`), i.e. exactly the objects whose changes can
reach it. A recorded write outside that is skipped (another namespace; another pool than the one a
name-scoped watch follows). Label selectors cannot be decided from a name, so a watch that uses one
is refused with an error rather than guessed about.

Why from the EPP and not from the harness's idea of it: the view reports the very namespace and
selectors its informers pass to the watch request, so an EPP that wrongly watched every namespace
would say so, and the barrier would then wait for the other namespace's writes too — a crosstalk
check ("a model in another namespace is ignored") stays sound. What remains unseen is only an API
client that sends something other than what its informer was given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.base.eventually import eventually

# The view's `watches` keys: the API plurals of the kinds the EPP watches.
POOLS: Final = "inferencepools"
MODELS: Final = "inferencemodels"
PODS: Final = "pods"

DEFAULT_TIMEOUT: Final = 15.0
# The view is one small JSON document; polling it every 5 ms costs the EPP little and keeps a
# settle that follows a write close to the EPP's own latency (see benchmarks/bench_settle.py).
POLL_INTERVAL: Final = 0.005

View = dict[str, Any]
ReadView = Callable[[], View]


class SettleUnsupported(RuntimeError):
    """The EPP does not report what the barrier needs (no `watches` in its view, or a watch scoped by
    something the barrier cannot evaluate). Not an AssertionError: waiting would never help."""


def revision(resource_version: str | int) -> int:
    """A resourceVersion as the etcd revision it is (see the module docstring: only here)."""
    return int(resource_version)


@dataclass(frozen=True)
class Scope:
    """What one watch of the EPP covers, as its view entry states it."""

    namespace: str  # "" = every namespace
    names: frozenset[str] | None  # from a `metadata.name=` field selector; None = any name

    @classmethod
    def of(cls, resource: str, watch: Mapping[str, Any]) -> Scope:
        if watch.get("labelSelector"):
            raise SettleUnsupported(f"{resource}: cannot tell which writes a label-selected watch sees")
        namespace = str(watch.get("namespace") or "")
        names: frozenset[str] | None = None
        for term in filter(None, str(watch.get("fieldSelector") or "").split(",")):
            field, op, value = term.partition("=")
            if field == "metadata.name" and op:
                names = frozenset({value.lstrip("=")})
            elif field == "metadata.namespace" and op:
                namespace = value.lstrip("=")
            else:
                raise SettleUnsupported(f"{resource}: cannot evaluate the field selector {term!r}")
        return cls(namespace, names)

    def covers(self, namespace: str, name: str) -> bool:
        return (not self.namespace or namespace == self.namespace) and (
            self.names is None or name in self.names
        )


class SettleBarrier:
    """Records the test's writes; `wait` until the EPP has applied them and is idle.

    Self-contained on purpose: it needs only the write answers (`record`) and a way to read the
    EPP's debug view, so it works the same for the in-process EPP and for the EPP process.
    Thread-safe recording (simulator threads never write, but a test may hand work to threads).
    """

    def __init__(self) -> None:
        # (plural, namespace, name) -> the newest revision the test wrote to that object.
        self._written: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def record(self, resource: str, obj: Mapping[str, Any]) -> None:
        """A write's answer (`harness.cluster.kube.WriteObserver`): remember its revision for its object."""
        meta = obj.get("metadata") or {}
        written = meta.get("resourceVersion")
        if not written:
            raise ValueError(f"a {resource} write answered without a resourceVersion: {obj.get('kind')}")
        key = (resource, str(meta.get("namespace", "")), str(meta.get("name", "")))
        with self._lock:
            self._written[key] = max(self._written.get(key, 0), revision(written))

    def targets(self, watches: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
        """Per kind, the newest recorded write inside the scope the EPP reports for that kind."""
        scopes = {resource: Scope.of(resource, watch) for resource, watch in watches.items()}
        targets: dict[str, int] = {}
        with self._lock:
            written = list(self._written.items())
        for (resource, namespace, name), rev in written:
            scope = scopes.get(resource)
            if scope is not None and scope.covers(namespace, name):
                targets[resource] = max(targets.get(resource, 0), rev)
        return targets

    def wait(
        self,
        read_view: ReadView,
        *,
        at: Mapping[str, str | int] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> View:
        """Until the EPP has applied every recorded write it can see (and `at`: plural -> a
        resourceVersion written some other way, which the caller vouches is in scope) and is idle.

        Returns the view that showed it settled. On timeout, raises AssertionError naming, per
        kind, how far the EPP got and what it still has to do.
        """
        explicit = {resource: revision(rv) for resource, rv in (at or {}).items()}

        def settled() -> View:
            view = read_view()
            watches = view.get("watches")
            if not isinstance(watches, Mapping):
                raise SettleUnsupported("the EPP's debug view has no 'watches': it cannot be settled on")
            targets = self.targets(watches)
            for resource, rev in explicit.items():
                targets[resource] = max(targets.get(resource, 0), rev)
            assert watches, "the EPP reports no watches yet (starting?)"
            behind = [
                _behind(resource, watches.get(resource), target)
                for resource, target in sorted(targets.items())
            ]
            busy = [_busy(resource, watch) for resource, watch in sorted(watches.items())]
            problems = [p for p in (*behind, *busy) if p]
            assert not problems, "; ".join(problems)
            return view

        return eventually(settled, timeout=timeout, interval=POLL_INTERVAL, message="EPP settled")


def _behind(resource: str, watch: Mapping[str, Any] | None, target: int) -> str:
    if watch is None:
        return f"{resource}: not watched, but written at {target}"
    applied = str(watch.get("appliedResourceVersion") or "")
    if not applied or revision(applied) < target:
        return f"{resource}: applied {applied or 'nothing yet'}, written {target}"
    return ""


def _busy(resource: str, watch: Mapping[str, Any]) -> str:
    if not watch.get("appliedResourceVersion"):
        return f"{resource}: initial list not reconciled yet"
    if watch.get("idle"):
        return ""
    return (
        f"{resource}: {watch.get('queued')} queued, {watch.get('processing')} in flight, "
        f"{watch.get('retrying')} waiting to retry"
    )
