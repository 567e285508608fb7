# The pair-schedule search in C++ (passes/scheduling/csrc), bound with pybind11;
# passes/scheduling/gap_fit.py calls it.
from collections.abc import Sequence

SOURCE_SHA256: str

def lower_bound(durations: Sequence[float], streams: Sequence[int], deps: Sequence[Sequence[int]]) -> float: ...
def search(
    durations: Sequence[float],
    streams: Sequence[int],
    deps: Sequence[Sequence[int]],
    sides: Sequence[int],
    movable: Sequence[bool],
    deadlines: Sequence[float | None],
    initial: Sequence[Sequence[float]],
    merge_iterations: int,
    merge_patience: int,
    merge_phases: int,
    rounds: int,
    reinsert_rounds: int,
    starts: int,
    merge_span: int,
) -> tuple[list[float], dict[str, str | int | float]]: ...
