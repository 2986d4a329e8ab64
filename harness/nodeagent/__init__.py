"""The node agent: kubelets for the harness's cluster, in one process (``python -m harness.nodeagent``).

``agent`` (nodes, watches, health), ``pod`` (one pod's lifecycle), ``status`` (the status a kubelet
writes), ``probes``, ``images`` (which process runs for an image), ``runtime`` and ``zygote`` (how
container processes are started), ``api`` (the writes). The README's "The node agent" section is the
user's view.
"""
