"""Activation offload: the checkpointed blocks' inputs held in host memory between the forward and the backward.

Under activation checkpointing a decoder block keeps only its inputs for the backward (its hidden states, the rotary
tables, a padded window's mask): layers x tokens x hidden x 2 bytes, 3.5 GiB for a 7B at 32K tokens per GPU. With
`actor.activation_offload` each block's checkpoint saves those inputs through `HostInputs`: a copy in host memory
(pinned on CUDA, copied on a side stream), and in the backward, which visits the blocks last to first, the block
before the one being recomputed is copied back ahead of its turn, so one block's inputs at a time come back on the
device. On the CPU the same code runs with a real second buffer (a host copy of a host tensor), so it is tested.
Inputs several blocks share (the rotary tables) are copied once.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

# smaller saved inputs (ids, a block's tiny tensors) stay where they are: not worth a copy
MIN_BYTES = 1 << 16


@dataclass
class _Held:
    """One saved input in host memory, and its copy on the way back (prefetched), if any."""

    host: torch.Tensor
    device: torch.device
    uses: int = 1  # unpacks still to come: the copy on the device is dropped after the last
    back: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None


@dataclass
class HostInputs:
    """The host copies of the checkpointed blocks' inputs of one forward, in the order they were saved."""

    min_bytes: int = field(default_factory=lambda: MIN_BYTES)
    held: list[_Held] = field(default_factory=list)
    # the same tensor object saved by several blocks (the rotary tables): its index, while the object lives (a
    # freed tensor's id, and its memory, may be reused by another block's input: never matched by address)
    shared: dict[int, tuple[weakref.ref, int]] = field(default_factory=dict)
    stream: torch.cuda.Stream | None = None

    @property
    def held_bytes(self) -> int:
        return sum(h.host.nbytes for h in self.held)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | int:
        if not tensor.is_floating_point() or tensor.nbytes < self.min_bytes:
            return tensor
        ref, index = self.shared.get(id(tensor), (None, -1))
        if ref is not None and ref() is tensor:  # the same input of another block
            self.held[index].uses += 1
            return index
        cuda = tensor.device.type == "cuda"
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=cuda)
        if cuda:
            self.stream = self.stream or torch.cuda.Stream(tensor.device)
            self.stream.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(self.stream):
                host.copy_(tensor, non_blocking=True)
                tensor.record_stream(self.stream)  # not reused before the copy has read it
        else:
            host.copy_(tensor)
        self.held.append(_Held(host, tensor.device))
        self.shared[id(tensor)] = (weakref.ref(tensor), len(self.held) - 1)
        return len(self.held) - 1

    def unpack(self, packed: torch.Tensor | int) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        tensor = self._back(packed)
        if packed > 0:  # the backward goes last block first: the one before is next
            self._prefetch(packed - 1)
        return tensor

    def _prefetch(self, index: int) -> None:
        held = self.held[index]
        if held.back is not None or held.uses == 0:  # on its way back already, or no longer needed
            return
        if held.device.type == "cuda":
            with torch.cuda.stream(self.stream):
                held.back = held.host.to(held.device, non_blocking=True)
                held.ready = torch.cuda.Event()
                held.ready.record(self.stream)
        else:
            held.back = held.host.clone()

    def _back(self, index: int) -> torch.Tensor:
        self._prefetch(index)
        held = self.held[index]
        tensor = held.back
        if held.ready is not None:
            torch.cuda.current_stream(held.device).wait_event(held.ready)
            tensor.record_stream(torch.cuda.current_stream(held.device))
        held.uses -= 1
        if (
            held.uses == 0
        ):  # one block's inputs at a time on the device: autograd holds this one while it needs it
            held.back = held.ready = None
        return tensor


def offloaded_checkpoint(store: Callable[[], HostInputs]) -> Callable[..., torch.Tensor]:
    """A checkpoint function for `_gradient_checkpointing_func` whose saved inputs go to `store()`'s host memory."""

    def run(function: Callable[..., torch.Tensor], *args, **kwargs) -> torch.Tensor:
        held = store()
        with saved_tensors_hooks(held.pack, held.unpack):
            return checkpoint(function, *args, use_reentrant=False, **kwargs)

    return run


def checkpoint_blocks(model: torch.nn.Module, store: Callable[[], HostInputs] | None) -> None:
    """Checkpoint every decoder block of a Hugging Face model, with its inputs in `store()`'s host memory (None:
    kept on the device, the plain checkpointing)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if store is None:
        return
    run = offloaded_checkpoint(store)
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) and hasattr(
            module, "_gradient_checkpointing_func"
        ):
            module._gradient_checkpointing_func = run  # what gradient_checkpointing_enable set, ours instead
