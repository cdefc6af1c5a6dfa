"""Weights from the training ranks to the rollout replicas by collective (rollout.weight_transfer: collective).

A process group joins the training ranks (group ranks 0..W-1, the store served by training rank 0) and the replicas'
ranks (W..). After an update each training rank keeps a snapshot of its own FSDP2 shard on the host, in the dtype the
actor's unsharded weights have (`snapshot`), and sends it to every replica rank in buckets of about `bucket_bytes`
of the full model: a bucket is a run of whole tensors, each training rank's part of it one flat byte buffer. A
replica rank receives every training rank's part of a bucket, puts the full tensors together (each tensor's rows
in rank order, FSDP2's Shard(0) split) and stages them under the version until the controller asks for them. So no
process ever holds the full model to send it (the object-store route gathers it on every rank and copies it through
Ray's store), and the transfer runs in the ranks' aside thread while the trainer trains the next step.

The group's backend is rollout.weight_transfer_backend: gloo (the default, CPU and GPU nodes alike) sends the host
snapshots' buckets over TCP; nccl copies each bucket to the rank's GPU and sends it GPU to GPU (on a side stream, so
the training thread's kernels do not wait on it), and the replica copies each bucket it receives to its host and
puts the full tensors together there. Only the backend and the buckets' device differ; nccl has not yet run (a node of one GPU cannot hold two NCCL
ranks), gloo is what the tests run. Either way a replica's engine loads from its host copy as it does from Ray's
store.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from or1.layout import ROLLOUT_SHARD_FILE, rollout_shard_file

# How long a send, a receive or the group's rendezvous may wait. A peer that dies while a transfer is in flight can
# leave gloo waiting (no error) until this timeout, and the next transfer waits for that one: it bounds how long a
# replica's death holds the route. A bucket's part (at most rollout.weight_bucket_mb) moves in seconds on any link.
TIMEOUT = timedelta(minutes=2)


@dataclass(frozen=True)
class TensorSpec:
    """One parameter: its name, full shape, dtype, and each training rank's rows of it (FSDP2's Shard(0) split)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    rows: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes


def shard_rows(length: int, ranks: int) -> tuple[int, ...]:
    """Each rank's rows of a dimension of `length` sharded over `ranks` (torch.chunk's split, which FSDP2 uses)."""
    size = -(-length // ranks)
    return tuple(max(0, min(size, length - r * size)) for r in range(ranks))


def _locals(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """Every parameter (tied aliases once) with this rank's part of it (a unit a forward left gathered, as FSDP2
    leaves the root after a forward without backward, is resharded first)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            raise TypeError(f"{name} is not sharded by FSDP2 (a DTensor): the collective route sends shards")
        yield name, param, param.to_local()


def local_shards(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """This rank's part of every parameter, in `dtype`, as host copies."""
    return {
        name: local.detach().to(device="cpu", dtype=dtype, copy=True) for name, _, local in _locals(model)
    }


def layout(model: torch.nn.Module, dtype: torch.dtype, rank: int, ranks: int) -> list[TensorSpec]:
    """What every rank's snapshot holds, in order; checks this rank's part against the split it assumes."""
    specs = []
    for name, param, local in _locals(model):
        rows = shard_rows(param.shape[0], ranks)
        if local.shape[0] != rows[rank]:
            raise RuntimeError(f"{name}: rank {rank} holds {local.shape[0]} rows, the split says {rows}")
        specs.append(TensorSpec(name, tuple(param.shape), dtype, rows))
    return specs


def buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[TensorSpec]]:
    """Runs of whole tensors of at most `bucket_bytes` each (a larger tensor is a bucket of its own)."""
    out: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if out[-1] and size + spec.nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(spec)
        size += spec.nbytes
    return [b for b in out if b]


def rank_part(bucket: list[TensorSpec], rank: int) -> int:
    """The bytes of `rank`'s part of a bucket."""
    return sum(s.rows[rank] * s.row_bytes for s in bucket)


class WeightGroup:
    """This process's place in the transfer group: `senders` training ranks first, then the replica ranks; buckets
    move over `backend` (gloo: from host memory; nccl: from `device`, this process's GPU, named because the group
    is joined and used from threads whose current CUDA device is not set)."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world: int,
        senders: int,
        backend: str = "gloo",
        device: torch.device | None = None,
    ) -> None:
        self.rank, self.world, self.senders = rank, world, senders
        self.store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=TIMEOUT)
        prefixed = dist.PrefixStore("or1-weights", self.store)
        self.stream = None
        if backend == "nccl":
            if device is None or device.type != "cuda":
                raise ValueError(f"the nccl weight group needs this process's CUDA device, not {device}")
            self.device = device
            self.stream = torch.cuda.Stream(device)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = TIMEOUT
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world, options)
        else:
            self.device = torch.device("cpu")
            self.group = dist.ProcessGroupGloo(prefixed, rank, world, TIMEOUT)

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """The buckets' copies and transfers on this group's side stream (nccl), done when the block ends."""
        if self.stream is None:
            yield
            return
        with torch.cuda.stream(self.stream):
            yield
        self.stream.synchronize()

    def send(self, specs: list[TensorSpec], shards: dict[str, torch.Tensor], bucket_bytes: int) -> int:
        """Send this training rank's part of every bucket to every replica rank; the bytes sent to each."""
        sent = 0
        for tag, bucket in enumerate(buckets(specs, bucket_bytes)):
            parts = [shards[s.name].reshape(-1).view(torch.uint8) for s in bucket if shards[s.name].numel()]
            if not parts:
                continue
            with self._on_device():
                flat = torch.cat(parts).to(self.device)
                works = [self.group.send([flat], dst, tag) for dst in range(self.senders, self.world)]
                for work in works:
                    work.wait()
            sent += flat.numel()
        return sent

    def receive(self, specs: list[TensorSpec], bucket_bytes: int) -> dict[str, torch.Tensor]:
        """Every training rank's part of every bucket, put together into full tensors."""
        full: dict[str, torch.Tensor] = {}
        for tag, bucket in enumerate(buckets(specs, bucket_bytes)):
            with self._on_device():
                buffers = {
                    r: torch.empty(n, dtype=torch.uint8, device=self.device)
                    for r in range(self.senders)
                    if (n := rank_part(bucket, r))
                }
                works = [self.group.recv([buffer], r, tag) for r, buffer in buffers.items()]
                for work in works:
                    work.wait()
                parts = {r: buffer.cpu() for r, buffer in buffers.items()}  # staged on the host (gloo: these)
            offsets = dict.fromkeys(parts, 0)
            for spec in bucket:
                pieces = []
                for r, buffer in parts.items():
                    n = spec.rows[r] * spec.row_bytes
                    pieces.append(
                        buffer[offsets[r] : offsets[r] + n].view(spec.dtype).view(-1, *spec.shape[1:])
                    )
                    offsets[r] += n
                full[spec.name] = torch.cat(pieces) if len(pieces) > 1 else pieces[0].clone()
        return full


def save_snapshots(
    snapshots: dict[int, dict[str, torch.Tensor]], folder: Path, rank: int, ranks: int
) -> None:
    for version, shards in snapshots.items():
        save_file(shards, folder / rollout_shard_file(version, rank, ranks))


def load_snapshots(folder: Path, rank: int, ranks: int) -> dict[int, dict[str, torch.Tensor]]:
    """The snapshots this rank saved into `folder` (none when the checkpoint was written by another world size)."""
    found = {}
    for path in folder.iterdir():
        match = ROLLOUT_SHARD_FILE.match(path.name)
        if match and (int(match.group(2)), int(match.group(3))) == (rank, ranks):
            found[int(match.group(1))] = load_file(path)
    return found
