"""The pytest plugin: options, the shared control plane, and thin fixtures over the beds.

May import every part but `cli`.
"""
