"""The gateway's process and the daemon's side of it: start, hand-over, listening, its files."""
