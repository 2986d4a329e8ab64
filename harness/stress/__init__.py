"""Churn, ext_proc fuzzing and the defects planted to prove the tests can fail.

May import the beds and everything below them; independent of the plugin.
"""
