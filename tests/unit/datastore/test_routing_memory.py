"""The handlers' routing memory in the datastore: requests in flight per pod, prompt prefixes per pod."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.api import EndpointKey, NamespacedName, PodObject, v1alpha2
from epp.datastore import Datastore, Dispatched, Metrics, new_datastore
from harness.cluster.builders import PodBuilder, PoolBuilder

NS = "ns1"


def pod(name: str, ip: str = "10.0.0.1") -> PodObject:
    return PodObject.from_api(PodBuilder(name).namespace(NS).labels(app="vllm").ready(ip).build())


def key(name: str) -> EndpointKey:
    return EndpointKey(NS, name)


def pod_key(name: str) -> NamespacedName:
    return NamespacedName(NS, name)


POOL = v1alpha2.pool_from_api(PoolBuilder("pool").namespace(NS).selector(app="vllm").port(8000).build())


def store(*names: str, capacity: int = 100) -> Datastore:
    ds = new_datastore(prefix_capacity_per_pod=capacity)
    ds.pool_set(POOL)
    for i, name in enumerate(names):
        ds.pod_update_or_add(pod(name, f"10.0.0.{i + 1}"))
    return ds


def dispatched(ds: Datastore, name: str) -> Dispatched:
    found = ds.pod_get(key(name))
    assert found is not None
    return found.dispatched


def test_dispatches_are_counted_per_pod_and_model_until_they_finish() -> None:
    ds = store("a", "b")
    assert ds.pod_dispatch_started(key("a"), "lora-1")
    assert ds.pod_dispatch_started(key("a"), "lora-1")
    assert ds.pod_dispatch_started(key("a"), "base")
    assert dispatched(ds, "a") == Dispatched(3, frozenset({"lora-1", "base"}), last=3)
    assert dispatched(ds, "b") == Dispatched()
    ds.pod_dispatch_finished(key("a"), "lora-1")
    ds.pod_dispatch_finished(key("a"), "base")
    assert dispatched(ds, "a") == Dispatched(1, frozenset({"lora-1"}), last=3)
    ds.pod_dispatch_finished(key("a"), "lora-1")
    ds.pod_dispatch_finished(key("a"), "lora-1")  # one too many: never below zero
    assert dispatched(ds, "a") == Dispatched(last=3)


def test_a_prompt_counts_as_prefilling_until_its_first_byte_and_as_context_until_it_ends() -> None:
    ds = store("a", "b")
    assert ds.pod_dispatch_started(key("a"), "m", prompt_tokens=300)
    assert ds.pod_dispatch_started(key("a"), "m", prompt_tokens=100)
    assert ds.pod_dispatch_started(key("b"), "m", prompt_tokens=50)
    a = dispatched(ds, "a")
    assert (a.prompt_tokens, a.prefill_tokens, a.prefilled_at) == (400, 400, None)
    ds.pod_prefill_done(key("a"), 300, at=7.5)
    a = dispatched(ds, "a")
    assert (a.count, a.prompt_tokens, a.prefill_tokens, a.prefilled_at) == (2, 400, 100, 7.5)
    ds.pod_dispatch_finished(key("a"), "m", 300, prefilled=True)
    ds.pod_dispatch_finished(key("a"), "m", 100, prefilled=False)  # ended before its first byte
    a = dispatched(ds, "a")
    assert (a.count, a.prompt_tokens, a.prefill_tokens, a.prefilled_at) == (0, 0, 0, 7.5)
    b = dispatched(ds, "b")
    assert (b.prompt_tokens, b.prefill_tokens) == (50, 50)  # another pod's first byte is not b's


def test_token_counts_never_go_below_zero_nor_survive_the_pod() -> None:
    ds = store("a")
    ds.pod_prefill_done(key("a"), 10, at=1.0)  # nothing in flight: nothing to take from
    assert dispatched(ds, "a") == Dispatched()
    ds.pod_dispatch_started(key("a"), "m", prompt_tokens=20)
    ds.pod_prefill_done(key("a"), 50, at=2.0)
    ds.pod_dispatch_finished(key("a"), "m", 50, prefilled=False)
    a = dispatched(ds, "a")
    assert (a.prompt_tokens, a.prefill_tokens) == (0, 0)
    ds.pod_dispatch_started(key("a"), "m", prompt_tokens=20)
    ds.pod_delete(pod_key("a"))
    ds.pod_prefill_done(key("a"), 20, at=3.0)  # a late first byte from the old pod: harmless
    ds.pod_update_or_add(pod("a"))
    assert dispatched(ds, "a") == Dispatched()


def test_each_dispatch_is_numbered_over_the_pool_and_the_pod_keeps_its_latest() -> None:
    ds = store("a", "b")
    assert ds.pod_dispatch_started(key("a"), "base")
    assert ds.pod_dispatch_started(key("b"), "base")
    assert ds.pod_dispatch_started(key("a"), "base")
    assert (dispatched(ds, "a").last, dispatched(ds, "b").last) == (3, 2)
    ds.pod_dispatch_finished(key("b"), "base")  # finishing does not make a pod "recently chosen"
    assert (dispatched(ds, "a").last, dispatched(ds, "b").last) == (3, 2)
    assert not ds.pod_dispatch_started(key("gone"), "base")  # an unknown pod takes no number
    assert ds.pod_dispatch_started(key("b"), "base")
    assert dispatched(ds, "b").last == 4


def test_a_scrape_or_an_address_change_keeps_the_counts() -> None:
    ds = store("a")
    ds.pod_dispatch_started(key("a"), "m")
    ds.pod_update_metrics_if_exist(key("a"), Metrics(waiting_queue_size=4, updated_at=1.0))
    ds.pod_update_or_add(pod("a", "10.9.9.9"))
    found = ds.pod_get(key("a"))
    assert found is not None
    assert (found.pod.address, found.metrics.waiting_queue_size, found.dispatched.count) == ("10.9.9.9", 4, 1)


def test_a_pod_that_leaves_forgets_its_counts_and_prefixes() -> None:
    ds = store("a")
    ds.pod_dispatch_started(key("a"), "m")
    ds.prefix_record(key("a"), (1, 2))
    ds.pod_delete(pod_key("a"))
    assert not ds.pod_dispatch_started(key("a"), "m")  # gone: nothing counted
    ds.pod_dispatch_finished(key("a"), "m")  # a late end for the old pod is harmless
    ds.pod_update_or_add(pod("a"))
    assert dispatched(ds, "a") == Dispatched()
    assert ds.prefix_matches((1, 2)) == {}


def test_prefix_matches_count_leading_blocks_per_pod() -> None:
    ds = store("a", "b")
    ds.prefix_record(key("a"), (1, 2, 3))
    ds.prefix_record(key("b"), (1, 2))
    ds.prefix_record(key("b"), (9,))
    assert ds.prefix_matches((1, 2, 3, 4)) == {key("a"): 3, key("b"): 2}
    assert ds.prefix_matches((9, 7)) == {key("b"): 1}
    assert ds.prefix_matches((8, 2, 3)) == {}  # its first block went nowhere
    assert ds.prefix_matches(()) == {}


def test_each_pod_keeps_its_most_recently_routed_blocks() -> None:
    ds = store("a", capacity=3)
    ds.prefix_record(key("a"), (1, 2))
    ds.prefix_record(key("a"), (3, 4))  # 4 blocks > 3: block 1, the oldest, is evicted
    assert ds.prefix_matches((1, 2)) == {}
    assert ds.prefix_matches((3, 4)) == {key("a"): 2}
    ds.prefix_record(key("a"), (3,))  # used again: now the newest
    ds.prefix_record(key("a"), (5,))  # evicts 2... then 4 is the oldest
    assert ds.prefix_matches((3,)) == {key("a"): 1}


def test_recording_for_an_unknown_pod_is_ignored() -> None:
    ds = store("a")
    ds.prefix_record(key("ghost"), (1,))
    assert ds.prefix_matches((1,)) == {}


def test_clear_forgets_the_routing_memory() -> None:
    ds = store("a")
    ds.prefix_record(key("a"), (1,))
    ds.clear()
    ds.pool_set(POOL)
    ds.pod_update_or_add(pod("a"))
    assert ds.prefix_matches((1,)) == {}
    assert dispatched(ds, "a") == Dispatched()


# --- prefix matches against a model of the per-pod LRUs ----------------------------------------
class LruModel:
    """What the prefix memory means, kept the plain way: each pod's last `capacity` distinct blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: dict[EndpointKey, collections.OrderedDict[int, None]] = {}

    def record(self, pod: EndpointKey, hashes: Sequence[int]) -> None:
        if not hashes:
            return
        lru = self.held.setdefault(pod, collections.OrderedDict())
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def matches(self, hashes: Sequence[int]) -> dict[EndpointKey, int]:
        """Each pod's run of leading blocks it holds, where that run is not empty."""
        found = {}
        for pod, lru in self.held.items():
            run = next((i for i, h in enumerate(hashes) if h not in lru), len(hashes))
            if run:
                found[pod] = run
        return found


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(1, 6),
    records=st.lists(
        st.tuples(st.sampled_from("abcdef"), st.lists(st.integers(0, 7), max_size=6)), max_size=30
    ),
    queries=st.lists(st.lists(st.integers(0, 7), max_size=8), min_size=1, max_size=5),
)
def test_prefix_matches_are_each_pods_leading_run_of_held_blocks(
    capacity: int, records: list[tuple[str, list[int]]], queries: list[list[int]]
) -> None:
    names = sorted({name for name, _ in records})
    ds = store(*names, capacity=capacity)
    model = LruModel(capacity)
    for name, hashes in records:
        ds.prefix_record(key(name), hashes)
        model.record(key(name), hashes)
    for hashes in queries:
        assert dict(ds.prefix_matches(hashes)) == model.matches(hashes)
