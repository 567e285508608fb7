"""Whole-iteration simulation of a pipeline plan (shared by the capacity report and the benchmarks).

- ``program``: the simulator's input: per-rank action lists over programs, transfers, gradient
  reductions, memory and FLOP figures.
- ``engine``: the discrete-event simulation of one iteration, with the DBO policy optional.
- ``routing``: seeded stochastic expert routing (balanced, Zipf-skewed, drifting, trace file).
- ``slots``: where a program's compute stream can wait, and which weight gradients the DBO may defer.
- ``build``: the input from a planned module, read through the plan view (the caller builds the view).
- ``capacity``: summaries over iterations, the capacity report (text and JSON).
- ``trace``: Perfetto/Chrome trace JSON and a PNG timeline of a simulated iteration.
"""
