# The C++ runtime (runtime/csrc), bound with pybind11; runtime/__init__.py re-exports it.
from collections.abc import Sequence

FORMAT_VERSION: int

class PlanInfo:
    pp: int
    vpp: int
    ep: int
    tp: int
    microbatches: int
    micro_batch_size: int
    seq_len: int
    dtype: str
    model: str
    cost_source: str
    hardware: str
    memory_budget_bytes: int
    @property
    def virtual_stages(self) -> int: ...

class TaskInfo:
    name: str
    kind: str
    layer: str
    movable: bool
    duration_us: float
    memory_bytes: int
    @property
    def resource(self) -> int: ...

class SlotInfo:
    collective_task: int
    base_us: float
    a2a_us: float
    gemm_us: float

class Instr:
    aux: int
    mb: int
    a: int
    b: int
    @property
    def op(self) -> int: ...
    @property
    def stream(self) -> int: ...

class Program:
    @property
    def rank(self) -> int: ...
    @property
    def signature(self) -> bytes: ...
    @property
    def format_version(self) -> int: ...
    @property
    def plan(self) -> PlanInfo: ...
    @property
    def tasks(self) -> list[TaskInfo]: ...
    @property
    def slots(self) -> list[SlotInfo] | None: ...
    @property
    def instructions(self) -> list[Instr]: ...
    def task_index(self, name: str) -> int: ...
    def __len__(self) -> int: ...

def load_program(data: bytes | bytearray | memoryview, rank: int, signature: bytes | None = None) -> Program: ...
def load_imbalance(expert_tokens: Sequence[int], ep: int) -> float: ...

class Action:
    id: int
    stream: int
    task: int
    mb: int
    peer: int
    vstage: int
    payload: int
    collective: int
    group: int
    filled: bool
    fallback: bool
    wait_for: int
    @property
    def kind(self) -> int: ...

class FSM:
    def __init__(
        self,
        program: Program,
        *,
        dbo: bool = True,
        memory_budget_bytes: int | None = None,
        min_slot_us: float = 0.0,
        max_registered: int = 4096,
        admission: bool = True,
    ) -> None: ...
    def advance(self) -> Action: ...
    def complete(self, action_id: int) -> None: ...
    def report_tokens(self, task: int, mb: int, expert_tokens: Sequence[int]) -> bool: ...
    def register_task(self, task: int, mb: int, deadline: int, memory_bytes: int | None = None) -> int: ...
    @property
    def pc(self) -> int: ...
    @property
    def counters(self) -> dict[str, float]: ...

def native_ns_per_action(
    program: Program, dbo: bool = True, memory_budget_bytes: int | None = None, repeats: int = 10
) -> tuple[float, float]: ...
