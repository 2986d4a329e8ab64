"""Process supervision, lifecycles, leak guards, port and address reservations, polling, binary paths.

The bottom layer: imports nothing else of the harness.
"""
