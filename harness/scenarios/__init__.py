"""Scenarios: the YAML scenario format and its replay (`harness replay`), and the EPP-agnostic
conformance scenarios (`conformance/`, pytest modules that `harness conformance` runs).

May import the plugin (the scenarios' fixtures) and everything below it; never `cli`.
"""
