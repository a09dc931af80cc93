"""The autoscaler's rule and the gateways' requests in flight it reads. Pure."""
