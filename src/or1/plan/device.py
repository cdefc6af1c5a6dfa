"""The GPUs of a node as the plan sees them: how many, and the memory each gives to PyTorch.

A card sold as "80GB" does not give 80 GiB to a process: `torch.cuda.get_device_properties(0).total_memory` is what
the CUDA driver exposes after its own reservations, and every byte the plan counts comes out of that. A name the
table knows is planned at its usable size; a size given without a known name is taken as the usable size itself
(pass what `torch.cuda.get_device_properties(0).total_memory / 2**30` prints on the machine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from or1.errors import UserError
from or1.plan.memory import GIB

# a name starts with a letter, so "8x-5" is no 8 GPUs named "8x"
DEVICE = re.compile(
    r"(?:(\d+)\s*[xX]\s*)?(?:([A-Za-z][\w.]*?)-)?(\d+(?:\.\d+)?)\s*(?:GB|GiB|G)?", re.IGNORECASE
)
# (a part of the name, the size on the box in GB) -> GiB that total_memory reports on that card
USABLE_GIB: dict[tuple[str, int], float] = {
    # 80 GB HBM cards (H100 SXM / PCIe, H800, A100 / A800 80GB): total_memory reads about 79.1 GiB (issue 38's reading of
    # the H100; NVIDIA's 80 GB parts expose the same 81,5xx MiB to nvidia-smi)
    ("H100", 80): 79.1,
    ("H800", 80): 79.1,
    ("A100", 80): 79.1,
    ("A800", 80): 79.1,
    # H200 141 GB: about 139 GiB (the H200 this project's GPU checks run on)
    ("H200", 141): 139.0,
}


@dataclass(frozen=True)
class Device:
    """The GPUs of one node: how many, their usable memory in bytes, a name and the size on the box."""

    count: int
    memory: int
    name: str = "GPU"
    nominal: float | None = None  # the size in the name (GB), when it differs from the usable memory
    host: int | None = (
        None  # the node's host memory in bytes, when known (checked against what offload puts there)
    )

    @classmethod
    def parse(cls, text: str) -> Device:
        """'8xH100-80GB' (a known card: its usable memory), '8x79.1', 'H200-141GB' or '80' (GiB per GPU, taken
        as usable; count 8 when not given)."""
        match = DEVICE.fullmatch(text.strip())
        if not match or int(match[1] or 8) < 1 or float(match[3]) <= 0:
            raise UserError(
                f"--gpus {text!r}: expected COUNTxNAME-MEMORY such as 8xH100-80GB (memory in GiB)"
            )
        count, name, size = match.groups()
        usable = usable_gib(name or "", float(size))
        return cls(
            int(count or 8),
            int(usable * GIB),
            name or "GPU",
            float(size) if usable != float(size) else None,
        )

    @property
    def label(self) -> str:
        if self.nominal is None:
            return f"{self.count}x{self.name}-{self.memory / GIB:g}GB"
        return f"{self.count}x{self.name}-{self.nominal:g}GB ({self.memory / GIB:.1f} GiB usable)"


def usable_gib(name: str, size: float) -> float:
    """The GiB a card of `name` sold as `size` GB gives to PyTorch; `size` itself for a card not in the table."""
    upper = name.upper()
    for (part, nominal), usable in USABLE_GIB.items():
        if part in upper and round(size) == nominal:
            return usable
    return size
