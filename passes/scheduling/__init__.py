"""Scheduling one forward/backward pair on two streams: the pair DAG, the gap-fit heuristic,
the baselines, the exact ILP, the z3 check, and running many of them in worker processes."""
