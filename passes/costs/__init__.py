"""What tasks and pairs cost: hardware descriptions, task durations, the contention model,
CPU calibration, the profile cache, and the glue to the runtime's pair executor."""
