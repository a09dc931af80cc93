"""Facts of this machine that every layer may ask: process identity and liveness,
probes, listening sockets, device discovery. Imports core and the leaves only."""
