"""The pytest plugin: options, the shared control plane, and thin fixtures over the beds.

May import the beds and everything below them; never `scenarios` or `cli`.
"""
