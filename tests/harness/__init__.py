"""The survival harness: failpoints, SIGKILL soak, races, bad input, squatters, security."""
