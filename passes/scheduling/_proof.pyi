# z3 proofs of pair schedules through z3's C API (passes/scheduling/csrc/proof.cpp), bound with
# pybind11; passes/scheduling/check.py calls it.
from collections.abc import Sequence

def load(path: str) -> str: ...
def prove(
    schedules: Sequence[
        tuple[
            Sequence[float],
            Sequence[float],
            Sequence[int],
            Sequence[Sequence[int]],
            Sequence[float | None],
            Sequence[str],
        ]
    ],
) -> bool: ...
