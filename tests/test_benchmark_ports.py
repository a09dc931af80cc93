"""The benchmarks' ports are claimed as the tests' are (tests/procs.py): a benchmark run
beside the suite (its smoke tests) never takes a block a test holds."""

from __future__ import annotations

from procs import BLOCK, free_ports, release_ports

from benchmarks import common


def test_a_benchmark_never_takes_a_block_a_test_holds() -> None:
    """A block a test holds, free to bind (its engine not started yet), was handed to a
    benchmark scanning from it: two engines then met on one port."""
    held = free_ports(BLOCK)
    try:
        got = common.free_port_block(BLOCK, start=held)
        assert got >= held + BLOCK or got + BLOCK <= held, (held, got)
        # ... and what the benchmark took, no test takes while the benchmark lives.
        assert common.free_port_block(BLOCK, start=got) != got
    finally:
        release_ports([held])
        common.release_claims()
