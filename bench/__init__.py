"""Benchmarks and simulators; not shipped with the platform (see BENCHMARKS.md)."""
