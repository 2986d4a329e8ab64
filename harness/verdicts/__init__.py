"""What the harness concludes: the consistency oracle (API vs the EPP's datastore), the traffic
oracle, the settle barrier, the observer and the named departures from upstream.

May import `harness.base`, `harness.cluster` and `harness.sim`.
"""
