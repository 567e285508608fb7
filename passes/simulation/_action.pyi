# The simulator's action loop in C++ (passes/simulation/csrc/action.cpp), bound with pybind11;
# passes/simulation/engine.py drives it.
from collections.abc import Sequence

class ActionLoop:
    def __init__(
        self,
        stream: Sequence[int],
        fixed: Sequence[float],
        var: Sequence[float],
        deps: Sequence[Sequence[int]],
        routed: Sequence[int],
        code: Sequence[int],
        side: Sequence[int],
        deferrable: Sequence[bool],
        slot: Sequence[bool],
        routed_layers: int,
    ) -> None: ...
    def start(self, t0: float, free_c: float, free_m: float, factors: Sequence[float]) -> None: ...
    def advance(self, policy: bool, pool_has_work: bool) -> tuple[int, float, float, float]: ...
    def defer(self) -> None: ...
    def run_stopped(self, fills: Sequence[float]) -> None: ...
    def finish(
        self,
        due: Sequence[float],
        c_free: float,
        c_busy: float,
        c_idle: float,
        m_free: float,
        m_busy: float,
        m_idle: float,
        total_dispatch: float,
        total_combine: float,
    ) -> tuple[float, float, float, float, float, float, float, float, float, float, float, float, float, float]: ...
