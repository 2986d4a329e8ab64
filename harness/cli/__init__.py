"""The `harness` command: up, build, demo, bench, replay and conformance, and the console output.

The top layer: may import every part.
"""
