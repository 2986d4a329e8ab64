"""The proxy's subset hint: which endpoints a request may go to (upstream v1 protocol).

The proxy may send, in the request's metadata namespace `envoy.lb.subset_hint`, the key
`x-gateway-destination-endpoint-subset`: a string with a comma list, or a list of strings, each
`ip` (any port of that address) or `ip:port` (IPv6 as `[addr]:port`, or bare `addr`). Candidates
outside the subset are never picked; a hint that leaves none is 503 (the request cannot be served
as the proxy asked), an absent hint filters nothing. `--disable-endpoint-subset-filter` ignores it.

Pure: parsing and matching take plain strings, so every form is table-tested; `stream` reads the
value out of the protobuf metadata.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"


def normalise_host(host: str) -> str:
    """One spelling per address (`::0001` and `::1` alike); a non-address is kept, lower-cased."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower()


@dataclass(frozen=True, slots=True)
class Subset:
    """The endpoints the proxy allows: whole addresses, and single (address, port) endpoints."""

    hosts: frozenset[str]
    endpoints: frozenset[tuple[str, int]]

    def allows(self, address: str, port: int) -> bool:
        host = normalise_host(address)
        return host in self.hosts or (host, port) in self.endpoints

    def describe(self) -> str:
        """The subset as the client may read it in a 503 (sorted, short)."""
        items = sorted(self.hosts) + sorted(
            f"{h}:{p}" if ":" not in h else f"[{h}]:{p}" for h, p in self.endpoints
        )
        text = ",".join(items[:8])
        return text + (",..." if len(items) > 8 else "") if text else "(empty)"


def _entry(text: str) -> tuple[str, int | None] | None:
    """(host, port or None) of one `ip`, `ip:port`, `[v6]`, `[v6]:port` or bare v6; None if unusable."""
    entry = text.strip()
    if not entry:
        return None
    port_text = ""
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            return None
        host, rest = entry[1:close], entry[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port_text = rest[1:]
    elif entry.count(":") == 1:
        host, port_text = entry.split(":")
    else:
        host = entry  # IPv4 without a port, or a bare IPv6 address
    if not host:
        return None
    if not port_text:
        return normalise_host(host), None
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        return None
    return normalise_host(host), int(port_text)


def parse_subset(value: str | Iterable[str]) -> Subset:
    """The subset a hint names: a comma list, or a list of entries (each may itself hold commas).
    Unusable entries (a bad port, an empty item) allow nothing; so an empty hint allows nothing."""
    items = (
        value.split(",") if isinstance(value, str) else [part for item in value for part in item.split(",")]
    )
    hosts: set[str] = set()
    endpoints: set[tuple[str, int]] = set()
    for item in items:
        parsed = _entry(item)
        if parsed is None:
            continue
        host, port = parsed
        if port is None:
            hosts.add(host)
        else:
            endpoints.add((host, port))
    return Subset(frozenset(hosts), frozenset(endpoints))
