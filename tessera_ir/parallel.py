"""Parallel settings of a training run, carried in the module header.

These are the knobs every part of Tessera reads: the frontend to size tasks,
the passes to plan stages and pairs, the runtime to build process groups.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from tessera_ir.errors import TesseraError
from tessera_ir.kinds import DTYPE_BYTES
from tessera_ir.model import Attrs
from tessera_ir.printer import spell_value


class ParallelConfigError(TesseraError):
    """Parallel settings that cannot describe a real run."""


@dataclass(frozen=True)
class ParallelConfig:
    pp: int = 1  # pipeline-parallel size (devices in the pipeline)
    vpp: int = 1  # virtual stages (model chunks) per pipeline device
    ep: int = 1  # expert-parallel size
    tp: int = 1  # tensor-parallel size
    microbatches: int = 1  # micro-batches per iteration
    micro_batch_size: int = 1  # sequences per micro-batch
    seq_len: int = 4096
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "dtype":
                if not isinstance(value, str) or value not in DTYPE_BYTES:
                    raise ParallelConfigError(
                        f"unknown dtype {spell_value(value)}; use one of {', '.join(sorted(DTYPE_BYTES))}"
                    )
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ParallelConfigError(
                    f"--{f.name.replace('_', '-')} must be a positive integer, got {spell_value(value)}"
                )
        if self.vpp > 1 and self.microbatches % self.pp != 0:
            raise ParallelConfigError(
                f"interleaved 1F1B needs the micro-batch count ({self.microbatches}) to be a multiple of "
                f"--pp ({self.pp}) when --vpp > 1"
            )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch (before tensor-parallel sequence sharding)."""
        return self.micro_batch_size * self.seq_len

    def to_attrs(self) -> Attrs:
        return dict(asdict(self))

    @classmethod
    def from_attrs(cls, attrs: Attrs) -> ParallelConfig:
        kwargs = {f.name: attrs[f.name] for f in fields(cls) if f.name in attrs}
        return cls(**kwargs)  # type: ignore[arg-type]

    def replace(self, **overrides: object) -> ParallelConfig:
        data = asdict(self)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return ParallelConfig(**data)
