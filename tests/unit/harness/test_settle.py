"""SettleBarrier against scripted debug views: what it waits for, what it skips, how it explains a timeout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.verdicts.settle import MODELS, PODS, POOLS, Scope, SettleBarrier, SettleUnsupported

NS = "ns1"


def watch(applied: int | str, *, idle: bool = True, namespace: str = NS, **extra: Any) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "fieldSelector": extra.pop("fieldSelector", None),
        "labelSelector": extra.pop("labelSelector", None),
        "receivedResourceVersion": str(applied),
        "appliedResourceVersion": str(applied),
        "queued": 0 if idle else 1,
        "processing": 0,
        "retrying": 0,
        "idle": idle,
        **extra,
    }


def view(
    pods: dict[str, Any], models: dict[str, Any] | None = None, pools: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "pool": None,
        "models": [],
        "pods": [],
        "watches": {
            PODS: pods,
            MODELS: models or watch(1),
            POOLS: pools or watch(1, fieldSelector="metadata.name=pool"),
        },
    }


def obj(name: str, rv: int, namespace: str = NS) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)}}


class Views:
    """A read_view that returns the scripted views in turn, then keeps returning the last."""

    def __init__(self, *views: dict[str, Any]) -> None:
        self._views: Iterator[dict[str, Any]] = iter(views)
        self.last = views[-1]
        self.reads = 0

    def __call__(self) -> dict[str, Any]:
        self.reads += 1
        self.last = next(self._views, self.last)
        return self.last


def test_waits_until_the_newest_write_of_each_kind_is_applied_and_every_kind_is_idle() -> None:
    barrier = SettleBarrier()
    barrier.record(PODS, obj("p1", 10))
    barrier.record(PODS, obj("p2", 12))
    barrier.record(MODELS, obj("m1", 11))
    views = Views(
        view(watch(11), models=watch(11)),  # pods behind
        view(watch(12, idle=False), models=watch(11)),  # received, still reconciling
        view(watch(12), models=watch(11), pools=watch(1, idle=False, fieldSelector="metadata.name=pool")),
        view(watch(12), models=watch(11)),
    )
    assert barrier.wait(views, timeout=5) is views.last
    assert views.reads == 4


def test_a_write_outside_the_watched_scope_is_not_waited_for() -> None:
    barrier = SettleBarrier()
    barrier.record(PODS, obj("p1", 10))
    barrier.record(PODS, obj("p1", 50, namespace="elsewhere"))  # another namespace: never seen
    barrier.record(POOLS, obj("other-pool", 60))  # the pool watch follows only "pool"
    barrier.record(POOLS, obj("pool", 9))
    watches = view(watch(10), pools=watch(9, fieldSelector="metadata.name=pool"))["watches"]
    assert barrier.targets(watches) == {PODS: 10, POOLS: 9}
    assert barrier.wait(Views(view(watch(10), pools=watch(9, fieldSelector="metadata.name=pool"))), timeout=1)


def test_the_newest_revision_of_an_object_wins_whatever_the_order_of_recording() -> None:
    barrier = SettleBarrier()
    barrier.record(PODS, obj("p1", 20))
    barrier.record(PODS, obj("p1", 15))
    assert barrier.targets(view(watch(1))["watches"]) == {PODS: 20}


def test_an_explicit_revision_is_waited_for_like_a_recorded_write() -> None:
    barrier = SettleBarrier()
    views = Views(view(watch(30)), view(watch(31)))
    barrier.wait(views, at={PODS: "31"}, timeout=5)
    assert views.reads == 2


def test_revisions_compare_as_numbers_not_strings() -> None:
    barrier = SettleBarrier()
    barrier.record(PODS, obj("p1", 9))
    barrier.wait(Views(view(watch(10))), timeout=1)  # "10" < "9" as strings


def test_a_timeout_says_how_far_each_kind_got() -> None:
    barrier = SettleBarrier()
    barrier.record(PODS, obj("p1", 12))
    stuck = view(watch(11), models=watch(5, idle=False))
    with pytest.raises(AssertionError) as caught:
        barrier.wait(Views(stuck), timeout=0.05)
    message = str(caught.value)
    assert "EPP settled" in message
    assert "pods: applied 11, written 12" in message
    assert "inferencemodels: 1 queued, 0 in flight, 0 waiting to retry" in message


def test_an_epp_that_has_not_listed_yet_is_not_settled() -> None:
    empty = {"pool": None, "models": [], "pods": [], "watches": {}}
    unlisted = view(watch(""))
    with pytest.raises(AssertionError, match="no watches yet"):
        SettleBarrier().wait(Views(empty), timeout=0.05)
    with pytest.raises(AssertionError, match="initial list not reconciled"):
        SettleBarrier().wait(Views(unlisted), timeout=0.05)


def test_an_epp_without_watch_progress_is_refused_at_once() -> None:
    views = Views({"pool": None, "models": [], "pods": []})
    with pytest.raises(SettleUnsupported, match="no 'watches'"):
        SettleBarrier().wait(views, timeout=5)
    assert views.reads == 1


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        pytest.param({}, Scope(NS, None), id="namespace-only"),
        pytest.param({"fieldSelector": "metadata.name=pool"}, Scope(NS, frozenset({"pool"})), id="by-name"),
        pytest.param(
            {"fieldSelector": "metadata.name==pool"}, Scope(NS, frozenset({"pool"})), id="double-equals"
        ),
    ],
)
def test_scope_is_read_from_the_watch(selectors: dict[str, str], expected: Scope) -> None:
    assert Scope.of(PODS, watch(1, **selectors)) == expected


@pytest.mark.parametrize(
    "selectors",
    [
        pytest.param({"labelSelector": "app=x"}, id="label-selector"),
        pytest.param({"fieldSelector": "status.phase=Running"}, id="other-field"),
        pytest.param({"fieldSelector": "metadata.name!=pool"}, id="inequality"),
    ],
)
def test_a_scope_the_barrier_cannot_evaluate_is_refused(selectors: dict[str, str]) -> None:
    with pytest.raises(SettleUnsupported):
        Scope.of(PODS, watch(1, **selectors))


def test_every_namespace_covers_every_write() -> None:
    assert Scope("", None).covers("anywhere", "anything")
    assert not Scope(NS, frozenset({"pool"})).covers(NS, "other")
    assert not Scope(NS, None).covers("elsewhere", "p1")


def test_a_write_answer_without_a_revision_is_an_error() -> None:
    with pytest.raises(ValueError, match="without a resourceVersion"):
        SettleBarrier().record(PODS, {"kind": "Status", "metadata": {}})
