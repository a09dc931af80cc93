"""reconcile: a Kubernetes-style declarative reconciler for local inference engines."""

__version__ = "0.1.0"
