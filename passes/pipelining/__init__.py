"""The pipeline schedule: the per-rank order of interleaved 1F1B and the pairs that meet."""
