"""The Kubernetes side: Go builds of the binaries, the control plane, certificates and identities,
upstream's CRDs, API helpers (kube, kubectl, helm), namespaces, nodes, forged pods and object builders.

May import `harness.base` only.
"""
