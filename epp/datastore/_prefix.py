"""Which prompt prefixes the EPP has sent to which pod: an approximate view of their prefix caches.

As upstream's prefix-aware proposal (reference/peers-and-simulators.md §1.2, proposal 0602): the
prompt is cut into fixed-size character blocks, each hashed together with everything before it, and
every pod keeps an LRU of the block hashes routed to it. A pod "has" a prefix of k blocks when it
holds the first k hashes of a request. Approximate: the model server may have evicted them since.
Private to the datastore (the only mutable shared state); its lock guards every call.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from epp.api.types import EndpointKey


class PrefixIndex:
    def __init__(self, capacity_per_pod: int) -> None:
        self._capacity = capacity_per_pod
        # pod -> its block hashes, least recently routed first.
        self._lru: dict[EndpointKey, collections.OrderedDict[int, None]] = {}
        # block hash -> the pods that hold it (the inverse of `_lru`, for matching).
        self._holders: dict[int, set[EndpointKey]] = {}

    def matches(self, hashes: Sequence[int]) -> Mapping[EndpointKey, int]:
        """For each pod holding a prefix of ``hashes``, the number of leading blocks it holds.

        A pod's count is written once, when it drops out (or at the end), not once per block it
        holds, and the candidates are only intersected when some of them lack the block: a system
        prompt shared by every pod cost a Python-level write per pod and block (2.2 ms a request at
        1,000 pods and 19 blocks; 0.25 ms now, benchmarks/bench_prefix.py)."""
        found: dict[EndpointKey, int] = {}
        candidates: set[EndpointKey] = set()
        reached = 0  # blocks every pod in `candidates` holds
        for h in hashes:
            holders = self._holders.get(h)
            if not holders:
                break
            if not reached:
                candidates = set(holders)
            elif not candidates <= holders:  # (the usual answer, yes, needs no new set)
                kept = candidates & holders
                found.update(dict.fromkeys(candidates - kept, reached))
                if not kept:
                    return found
                candidates = kept
            reached += 1
        found.update(dict.fromkeys(candidates, reached))
        return found

    def record(self, pod: EndpointKey, hashes: Sequence[int]) -> None:
        if not hashes or self._capacity <= 0:
            return
        lru = self._lru.setdefault(pod, collections.OrderedDict())
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._holders.setdefault(h, set()).add(pod)
        while len(lru) > self._capacity:
            old, _ = lru.popitem(last=False)
            self._drop(old, pod)

    def forget(self, pod: EndpointKey) -> None:
        for h in self._lru.pop(pod, {}):
            self._drop(h, pod)

    def clear(self) -> None:
        self._lru.clear()
        self._holders.clear()

    def _drop(self, h: int, pod: EndpointKey) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(pod)
            if not holders:
                del self._holders[h]
