"""Trace-driven simulation of the scheduler: the real policy code on a simulated clock.

``python -m bench.simulator`` replays the Philly trace (``../shared/traces``) under strict FIFO
and under ``services.scheduler.policy.schedule`` and compares them; ``python -m
bench.simulator.baselines`` runs those two side by side with strong baselines (see
BENCHMARKS.md). Modules: ``trace`` (loader), ``cluster`` (nodes and gang shapes), ``engine``
(discrete-event simulator), ``policies`` (FIFO and ours), ``easy``, ``las``, ``maxmin`` and
``srtf`` (the baselines; ``srtf`` is an oracle), ``gangs`` and ``preemptive`` (what the
baselines share), ``metrics`` and ``scorecard`` (pure figures), ``report`` (tables, JSON),
``synthetic`` (small traces in the same format, for tests).
"""
