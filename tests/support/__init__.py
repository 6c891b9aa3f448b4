"""Helpers shared by tests and benchmarks: in-process daemons, clocks, KV views, mesh links, the simulator."""
