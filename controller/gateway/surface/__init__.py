"""The gateway's HTTP surface: routes, client connections, forwarding, request bodies."""
