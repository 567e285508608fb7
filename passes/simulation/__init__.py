"""Whole-iteration simulation of a pipeline plan (shared by the capacity report and the benchmarks).

- ``program``: the simulator's input: per-rank action lists over compiled programs, transfers,
  gradient reductions, memory and FLOP figures.
- ``engine``: the discrete-event simulation of one iteration, with the DBO policy optional.
- ``routing``: seeded stochastic expert routing (balanced, Zipf-skewed, drifting, trace file).
- ``trace``: Perfetto/Chrome trace JSON and a PNG timeline of a simulated iteration.
"""
