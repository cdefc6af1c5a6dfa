"""Packed attention from sequence boundaries (engines/varlen.py) against the dense-mask path it replaces, transformers'
sdpa over the same packed row with the [T, T] block mask it builds from the position ids: log-probs, entropies and
every gradient equal to 1e-5 in float32, for sequences of very different lengths, sequences of one token, a row
holding one sequence, multi-head, grouped and single key/value heads, with and without activation checkpointing.
The new path never makes a tensor of T x T elements; the dense one does. (Padded micro-batches through the engine:
tests/engines/test_packing.py; Ulysses SP 2: tests/engines/test_ulysses.py.)"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import Qwen2Config, Qwen2ForCausalLM

from or1.algos.losses import entropy_from_logits, token_log_probs
from or1.engines import varlen
from or1.engines.varlen import Segments

LENGTHS = {
    "mixed": (1, 300, 7, 1, 45, 120, 64, 2),  # very different lengths, two sequences of one token
    "one-sequence": (97,),
    "single-tokens": (1, 1, 1),
    "equal": (16,) * 8,
}
KV_HEADS = {"mha": 4, "gqa": 2, "mqa": 1}


def make_models(kv_heads: int) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """The same small Qwen2 twice: transformers' sdpa (the dense mask), and or1's packed attention."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        intermediate_size=128,
        attn_implementation="sdpa",
    )
    dense = Qwen2ForCausalLM(config)
    packed = Qwen2ForCausalLM(copy.deepcopy(config))
    packed.load_state_dict(dense.state_dict())
    varlen.enable(packed)
    return dense, packed


def packed_row(lengths: tuple[int, ...]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (1, sum(lengths)), generator=g)
    return {"input_ids": ids, "position_ids": torch.cat([torch.arange(n) for n in lengths])[None]}


def outputs_and_grads(model: Qwen2ForCausalLM, row: dict, **extra) -> dict[str, torch.Tensor]:
    """Next-token log-probs and entropies of every position, and the gradients of a loss of both."""
    model.zero_grad()
    logits = model(**row, use_cache=False, **extra).logits
    targets = torch.roll(row["input_ids"], -1, dims=1)
    log_probs, entropy = token_log_probs(logits, targets), entropy_from_logits(logits)
    (entropy.mean() * 0.1 - log_probs.mean()).backward()
    out = {"log_probs": log_probs.detach(), "entropy": entropy.detach()}
    return out | {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["", "checkpointing"])
@pytest.mark.parametrize("kv_heads", KV_HEADS.values(), ids=KV_HEADS.keys())
@pytest.mark.parametrize("lengths", LENGTHS.values(), ids=LENGTHS.keys())
def test_packed_attention_equals_the_dense_mask(
    lengths: tuple[int, ...], kv_heads: int, checkpointing: bool
) -> None:
    dense, packed = make_models(kv_heads)
    for model in (dense, packed) if checkpointing else ():
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    row = packed_row(lengths)
    expected = outputs_and_grads(dense, row)
    got = outputs_and_grads(packed, row, segments=Segments(lengths))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-5, msg=key)
    if max(lengths) > 1:  # (a token alone attends to itself: its queries and keys get no gradient)
        assert all(
            float(g.abs().max()) > 0 for key, g in expected.items() if "." in key
        )  # every weight learns


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operator returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return out


def test_no_tensor_grows_with_the_square_of_the_row() -> None:
    lengths = (64,) * 32  # 2,048 tokens: a [T, T] mask would be 4.2M elements, the logits are 0.6M
    tokens = sum(lengths)
    row = packed_row(lengths)
    largest = {}
    for name, model in zip(("dense", "packed"), make_models(2), strict=True):
        extra = {"segments": Segments(lengths)} if name == "packed" else {}
        with LargestTensor() as seen:
            outputs_and_grads(model, row, **extra)
        largest[name] = seen.largest
    assert largest["dense"] >= tokens * tokens  # the check sees the mask where there is one
    assert largest["packed"] < tokens * tokens / 4, largest


def test_segments_group_similar_lengths_and_cover_every_position() -> None:
    segments = Segments((10, 1, 8, 4, 9, 5))
    assert segments.cu_seqlens.tolist() == [0, 10, 11, 19, 23, 32, 37]
    assert (segments.total, segments.longest) == (37, 10)
    cpu = torch.device("cpu")
    assert segments.cu_seqlens_on(cpu) is segments.cu_seqlens_on(cpu)  # copied once, shared by every layer
    groups, back = segments.groups(torch.device("cpu"))
    # sorted by length: 10, 9, 8 (at least 0.8 x 10) | 5, 4 | 1
    assert [g.index.shape for g in groups] == [(3, 10), (2, 5), (1, 1)]
    assert groups[0].real.sum(-1).tolist() == [10, 9, 8] and groups[1].real.sum(-1).tolist() == [5, 4]
    assert groups[0].index[2].tolist() == [11 + i for i in range(8)] + [
        18,
        18,
    ]  # padded with its last position
    order = torch.cat([g.index[g.real] for g in groups])
    assert torch.equal(order[back], torch.arange(37))  # every position once, and the way back to row order
    assert segments.then(3).lengths == (10, 1, 8, 4, 9, 5, 3) and segments.then(0) is segments


def test_bad_segments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        Segments((3, 0))
    _, packed = make_models(2)
    row = packed_row((4, 4))
    with pytest.raises(ValueError, match="segments of 9 tokens"):
        packed(**row, segments=Segments((4, 5)))
    with pytest.raises(RuntimeError, match="segments"):
        packed(**row)


# ---- CUDA: torch's flash varlen kernel ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv_heads", [8, 2], ids=["mha", "gqa"])
def test_flash_varlen_equals_the_segment_kernel_on_cuda(kv_heads: int) -> None:
    segments = Segments((1, 700, 33, 1, 260, 128))
    g = torch.Generator(device="cuda").manual_seed(0)

    def draw(heads: int) -> torch.Tensor:
        x = torch.randn(heads, segments.total, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        return x.requires_grad_()

    q, k, v = draw(8), draw(kv_heads), draw(kv_heads)
    assert varlen.flash_unusable(q) is None
    results = []
    for kernel in (varlen.flash_attention, varlen.segment_attention):
        out = kernel(q, k, v, segments, None)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        results.append((out, *grads))
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_float32_on_cuda_falls_back_with_a_warning() -> None:
    q = torch.randn(1, 4, 10, 16, device="cuda")
    assert "float32" in varlen.flash_unusable(q)
    with pytest.warns(UserWarning, match="per segment"):
        out = varlen.attend(q, q[:, :2], q[:, :2], Segments((3, 7)), None)
    assert out.shape == (1, 10, 4, 16)
