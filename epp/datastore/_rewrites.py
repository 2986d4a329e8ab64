"""Which rewrite rule decides a model: the precedence of reference/upstream-v1.md §a, as an index.

Exact match beats catch-all; between objects, the oldest (`claim_order`: creationTimestamp, then
namespace/name) wins; within one object, the first rule in list order. The index is rebuilt from
every stored rewrite whenever one changes (rare), so a lookup per request is one dict read and the
removal of a winner hands its models to the next in line with no promotion step to forget.
Private to the datastore; its lock guards every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from epp.api.types import ModelRewrite, RewriteMatch


class RewriteIndex:
    def __init__(self, rewrites: Iterable[ModelRewrite] = ()) -> None:
        exact: dict[str, RewriteMatch] = {}
        catch_all: RewriteMatch | None = None
        for rewrite in sorted(rewrites, key=lambda r: r.claim_order):
            for rule in rewrite.rules:
                if rule.catch_all:
                    if catch_all is None:
                        catch_all = RewriteMatch(rewrite, rule, exact=False)
                    continue
                for model in rule.models:
                    exact.setdefault(model, RewriteMatch(rewrite, rule, exact=True))
        self.exact: Mapping[str, RewriteMatch] = MappingProxyType(exact)
        self.catch_all = catch_all

    def match(self, model: str) -> RewriteMatch | None:
        found = self.exact.get(model)
        return found if found is not None else self.catch_all
