"""The fused output head (or1/engines/fused_head.py): the same log-probs, entropies, losses and gradients as the
model's logits taken whole, without keeping any [T, V] tensor; through FSDPPolicyEngine on gloo ranks (packed and
padded rows, tied and untied heads, temperature != 1, Ulysses SP 2) the same numbers as the unfused engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_fsdp_engine import make_batch
from torch.autograd.graph import saved_tensors_hooks

from gloo_ranks import spawn_ranks
from or1.algos.losses import LossConfig, entropy_from_logits, token_log_probs
from or1.engines.fsdp_actor import FSDPPolicyEngine
from or1.engines.fused_head import fused_head
from or1.engines.loading import load_causal_lm
from or1.engines.train_settings import TrainSettings


def heads(seed: int = 0, tokens: int = 9, width: int = 16, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, tokens, width, generator=g).requires_grad_()
    weight = (torch.randn(vocab, width, generator=g) / width**0.5).requires_grad_()
    targets = torch.randint(0, vocab, (2, tokens), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_fused_head_equals_the_whole_logits(temperature: float, chunk: int, entropy_grad: bool) -> None:
    hidden, weight, targets = heads()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(targets.shape, generator=g), torch.randn(targets.shape, generator=g)

    def loss_and_grads(log_probs, entropy):
        (log_probs * a + entropy * b).sum().backward()
        grads = hidden.grad.clone(), weight.grad.clone()
        hidden.grad = weight.grad = None
        return log_probs.detach(), entropy.detach(), grads

    logits = hidden @ weight.T
    whole = loss_and_grads(
        token_log_probs(logits, targets, temperature),
        entropy_from_logits(logits if entropy_grad else logits.detach(), temperature),
    )
    fused = loss_and_grads(
        *fused_head(
            hidden, weight, targets, temperature, chunk=chunk, with_entropy=True, entropy_grad=entropy_grad
        )
    )
    for x, y in zip(fused[:2] + fused[2], whole[:2] + whole[2], strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of `fn()` (a view counts its storage)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_the_fused_head_keeps_no_logits_for_the_backward() -> None:
    """T = 512 positions, V = 4,096: the whole logits are 8 MiB in float32; the fused head keeps the hidden states
    and the weight (what exists anyway) and a chunk's targets, not one [T, V] tensor."""
    hidden, weight, targets = heads(tokens=256, width=32, vocab=4096)
    inputs = hidden.numel() * 4 + weight.numel() * 4 + targets.numel() * 8

    def whole():
        logits = hidden @ weight.T
        return token_log_probs(logits, targets), entropy_from_logits(logits)

    def fused():
        return fused_head(hidden, weight, targets, 1.0, chunk=64, with_entropy=True)

    logits_bytes = 2 * 256 * 4096 * 4
    assert saved_bytes(whole) >= logits_bytes
    assert saved_bytes(fused) <= inputs < logits_bytes / 10


def untied_copy(model_dir: Path, out: Path) -> Path:
    model = load_causal_lm(model_dir)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 1.5)
    model.save_pretrained(out)
    return out


# (tied head, sequence-parallel size, packed rows) per case: each runs in the same two rank processes
CASES = {
    "tied-padded": (True, 1, False),
    "tied-packed": (True, 1, True),
    "untied-packed": (False, 1, True),
    "tied-sp2": (True, 2, True),
    "untied-sp2": (False, 2, True),
}


def _rank(rank: int, world: int, init_file: str, models: dict[bool, str], out_file: str) -> None:
    """For each case, unfused then fused: log-probs and entropy at T = 0.7, then one PPO step with an entropy
    bonus."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for case, (tied, sp, packed) in CASES.items():
        results[case] = []
        for fused in (False, True):
            settings = TrainSettings(
                lr=1e-3,
                micro_batch_size=3,
                remove_padding=packed,
                sequence_parallel_size=sp,
                fused_head=fused,
                head_chunk_tokens=7,  # several chunks per micro-batch, the last one short
            )
            engine = FSDPPolicyEngine(models[tied], settings)
            batch = make_batch(8).chunk(world // sp)[rank // sp]
            out = engine.log_probs(batch, temperature=0.7, with_entropy=True)
            metrics = engine.train_step(batch, LossConfig(), temperature=0.7, entropy_coef=0.01)
            results[case].append(
                {
                    "log_probs": out.tensors["log_probs"],
                    "entropy": out.tensors["entropy"],
                    "metrics": metrics,
                    "params": {name: t.clone() for name, t in engine.named_full_params()},
                }
            )
    if rank == 0:
        torch.save(results, out_file)


@pytest.fixture(scope="module")
def engines_on_two_ranks(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every case's unfused and fused results, from one pair of rank processes."""
    tmp = tmp_path_factory.mktemp("fused_two_ranks")
    models = {True: str(model_dir), False: str(untied_copy(model_dir, tmp / "untied"))}
    spawn_ranks(_rank, 2, str(tmp / "pg"), models, str(tmp / "out.pt"), nprocs=2)
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_engine_equals_the_unfused_one_on_two_ranks(engines_on_two_ranks: dict, case: str) -> None:
    unfused, fused = engines_on_two_ranks[case]
    torch.testing.assert_close(fused["log_probs"], unfused["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused["entropy"], unfused["entropy"], atol=1e-5, rtol=1e-5)
    for key in ("pg_loss", "entropy_loss", "grad_norm", "entropy"):
        assert fused["metrics"][key] == pytest.approx(unfused["metrics"][key], rel=1e-5, abs=1e-7), key
    # one Adam step moves each weight by about lr * sign(gradient): equal gradients give equal weights
    for name, value in unfused["params"].items():
        torch.testing.assert_close(fused["params"][name], value, atol=5e-5, rtol=0)
