"""Deployments exported as Kubernetes objects (and their model pull as an initContainer). Pure."""
