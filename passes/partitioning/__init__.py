"""Choosing layer ranges per virtual stage: ranges and covers, the problem, memory, pruning,
the MILP, the exact DP, and Megatron-LM layout strings."""
