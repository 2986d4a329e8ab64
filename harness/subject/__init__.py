"""The EPP under test: ours as a process or in-process, any foreign EPP command, its probe
(health, metrics, datastore view) and the chart install.

May import `harness.base`, `harness.cluster` and `harness.dataplane`.
"""
