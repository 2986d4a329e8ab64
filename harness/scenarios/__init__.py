"""The scenario format and its replay.

May import the beds and everything below them.
"""
