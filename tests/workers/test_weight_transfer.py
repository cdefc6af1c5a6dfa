"""The collective weight route (or1.workers.weight_transfer): two FSDP2 training ranks send their shards in buckets
to a replica rank over gloo (over nccl on a node of two GPUs), and the replica puts together exactly the weights the
object-store route gathers."""

from __future__ import annotations

import pickle
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from gloo_ranks import spawn_ranks
from or1.workers import weight_transfer as transfer

BUCKET_BYTES = 48 * 1024  # several tensors a bucket, and the embeddings a bucket of their own


@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
def test_each_ranks_rows_are_torch_chunks(ranks):
    for length in (1, 2, 5, 7, 64, 293):
        chunks = [len(c) for c in torch.arange(length).chunk(ranks)]
        assert transfer.shard_rows(length, ranks) == tuple(chunks + [0] * (ranks - len(chunks)))


def test_buckets_hold_whole_tensors_in_order():
    specs = [
        transfer.TensorSpec(f"t{i}", (rows, 4), torch.float32, (rows,))
        for i, rows in enumerate([2, 3, 40, 1, 1])
    ]
    groups = transfer.buckets(specs, bucket_bytes=100)  # 16 bytes a row
    assert [[s.name for s in g] for g in groups] == [["t0", "t1"], ["t2"], ["t3", "t4"]]


def _rank(rank: int, init_file: str, model_dir: str, port: int, out: str, backend: str) -> None:
    """Ranks 0-1: FSDP2 training ranks (their gathered weights the object store's); rank 2: a replica. With nccl the
    training ranks send from GPU 0 (they never talk to each other over the group) and the replica receives on GPU 1."""
    torch.set_num_threads(1)
    device = torch.device("cuda", 0 if rank < 2 else 1) if backend == "nccl" else None
    folder = Path(out)
    if rank < 2:
        from or1.engines.fsdp_actor import FSDPPolicyEngine
        from or1.engines.train_settings import TrainSettings

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        engine = FSDPPolicyEngine(model_dir, TrainSettings(lr=1e-3))
        gathered = dict(engine.named_full_params())
        specs = transfer.layout(engine.model, torch.float32, rank, 2)
        shards = transfer.local_shards(engine.model, torch.float32)
        if rank == 0:
            save_file(gathered, folder / "gathered.safetensors")
            (folder / "specs.pkl").write_bytes(pickle.dumps(specs))
        group = transfer.WeightGroup("127.0.0.1", port, rank, 3, senders=2, backend=backend, device=device)
        sent = group.send(specs, shards, BUCKET_BYTES)
        (folder / f"sent{rank}").write_text(str(sent))
    else:
        group = transfer.WeightGroup("127.0.0.1", port, rank, 3, senders=2, backend=backend, device=device)
        while not (folder / "specs.pkl").is_file():
            time.sleep(0.05)
        specs = pickle.loads((folder / "specs.pkl").read_bytes())
        save_file(group.receive(specs, BUCKET_BYTES), folder / "received.safetensors")


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        pytest.param(
            "nccl",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl needs two GPUs: one a side"),
            ],
        ),
    ],
)
def test_a_replica_receives_the_gathered_weights_bit_for_bit(tmp_path, tiny_model_dir, backend):
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    spawn_ranks(_rank, str(tmp_path / "init"), str(tiny_model_dir), port, str(tmp_path), backend, nprocs=3)
    gathered, received = (
        load_file(tmp_path / "gathered.safetensors"),
        load_file(tmp_path / "received.safetensors"),
    )
    assert list(received) == list(gathered)
    for name, tensor in gathered.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
    specs = pickle.loads((tmp_path / "specs.pkl").read_bytes())
    assert len(transfer.buckets(specs, BUCKET_BYTES)) > 3
    assert any(s.rows[0] != s.rows[1] for s in specs)  # an odd row count: the shards are uneven
    # each training rank sent only its shard: together, the model once
    sent = [int((tmp_path / f"sent{r}").read_text()) for r in range(2)]
    assert sum(sent) == sum(t.numel() * t.element_size() for t in gathered.values())
