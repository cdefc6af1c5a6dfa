"""The separate placement's two weight routes side by side: seconds per GB and each process's peak memory.

Usage: .venv/bin/python bench/bench_weight_transfer.py [--rounds 3] [--shapes 0.5b-fp32,1.5b-bf16]
Two FSDP2 training ranks (Ray actors over gloo) hold a random Qwen2 of the shape, built on the meta device and
materialised shard by shard (no process ever holds the whole model to build it); one replica process receives it:
- object_store (rollout.weight_transfer object_store): every rank gathers the model unit by unit
  (`FSDPEngine.named_full_params`, as `publish_weights` does), rank 0 puts it in Ray's object store, the replica
  copies it out;
- collective (the default): each rank snapshots its shard on the host and sends it in buckets over a gloo group
  (`or1.workers.weight_transfer`), the replica puts the full tensors together.
Each round starts fresh processes for each route (so one route's peak is not the other's) and alternates the routes;
the medians are reported. Peak memory is each process's resident high-water mark (VmHWM) over the transfer minus
its resident memory before it; the object store's copy lives in Ray's shared memory, listed beside. The last line is
collective / object_store seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import ray
import torch

SHAPES = {  # Qwen2.5-0.5B and Qwen2.5-1.5B (their public config.json), random weights
    "0.5b-fp32": (
        {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
         "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True},
        torch.float32,
    ),
    "1.5b-bf16": (
        {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
         "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True},
        torch.bfloat16,
    ),
}  # fmt: skip
BUCKET_BYTES = 256 * 2**20  # rollout.weight_bucket_mb's default
GIB = 2**30


def rss_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> int:
    """Restart the high-water mark at the current resident size; that size, in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_kib("VmRSS")


@ray.remote(num_cpus=0)
class TrainingRank:
    """One FSDP2 rank of a random model of the shape."""

    def __init__(self, rank: int, world: int, address: str, shape: str) -> None:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from or1.engines.loading import decoder_layers

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
        config, dtype = SHAPES[shape]
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**config, torch_dtype=dtype)).to(dtype)
        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        model.to_empty(device="cpu")
        g = torch.Generator().manual_seed(rank)
        with torch.no_grad():
            for param in model.parameters():
                param.to_local().copy_(torch.randn(param.to_local().shape, generator=g).to(dtype) * 0.02)
        self.model, self.rank, self.dtype = model, rank, dtype

    def layout(self) -> list:
        from or1.workers import weight_transfer as transfer

        return transfer.layout(self.model, self.dtype, self.rank, 2)

    def object_store(self) -> tuple[ray.ObjectRef | None, int]:
        """publish_weights: every rank gathers, rank 0 puts; the reference and this rank's peak KiB over it."""
        from or1.engines.fsdp import FSDPEngine

        before = reset_peak()
        engine = SimpleNamespace(model=self.model)
        weights = {name: tensor.cpu() for name, tensor in FSDPEngine.named_full_params(engine)}
        ref = ray.put(weights) if self.rank == 0 else None
        del weights
        return ref, rss_kib("VmHWM") - before

    def collective(self, host: str, port: int, specs: list) -> int:
        """Snapshot the shard and send it; this rank's peak KiB over it."""
        from or1.workers import weight_transfer as transfer

        before = reset_peak()
        group = transfer.WeightGroup(host, port, self.rank, 3, senders=2)
        snapshot = transfer.local_shards(self.model, self.dtype)
        group.send(specs, snapshot, BUCKET_BYTES)
        del snapshot
        return rss_kib("VmHWM") - before


@ray.remote(num_cpus=0)
class Replica:
    def object_store(self, refs: list) -> tuple[int, int]:
        """Copy the model out of the object store; this process's peak KiB over it and the bytes it holds."""
        before = reset_peak()
        weights = ray.get(refs[0])
        held = sum(t.numel() * t.element_size() for t in weights.values())
        del weights
        return rss_kib("VmHWM") - before, held

    def collective(self, host: str, port: int, specs: list) -> tuple[int, int]:
        """Receive the model from the two ranks; this process's peak KiB over it and the bytes it holds."""
        from or1.workers import weight_transfer as transfer

        before = reset_peak()
        group = transfer.WeightGroup(host, port, 2, 3, senders=2)
        weights = group.receive(specs, BUCKET_BYTES)
        held = sum(t.numel() * t.element_size() for t in weights.values())
        del weights
        return rss_kib("VmHWM") - before, held


def one_round(shape: str, route: str) -> dict:
    from or1.hybrid.worker_group import free_address

    host, port = free_address()
    ranks = [TrainingRank.remote(r, 2, f"tcp://{host}:{port}", shape) for r in range(2)]
    replica = Replica.remote()
    try:
        specs = ray.get(ranks[0].layout.remote())
        ray.get([r.layout.remote() for r in ranks])  # both built (and each checked its part)
        began = time.perf_counter()
        if route == "object_store":
            results = ray.get([r.object_store.remote() for r in ranks])
            replica_peak, held = ray.get(replica.object_store.remote([results[0][0]]))
            rank_peaks = [peak for _, peak in results]
        else:
            host, port = free_address()
            sends = [r.collective.remote(host, port, specs) for r in ranks]
            replica_peak, held = ray.get(replica.collective.remote(host, port, specs))
            rank_peaks = ray.get(sends)
        seconds = time.perf_counter() - began
    finally:
        for actor in [*ranks, replica]:
            ray.kill(actor)
    shard = max(sum(s.rows[r] * s.row_bytes for s in specs) for r in range(2))
    return {"seconds": seconds, "bytes": held, "rank_peak": max(rank_peaks) * 1024, "replica_peak": replica_peak * 1024, "shard": shard}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    print(
        f"bucket {BUCKET_BYTES / 2**20:.0f} MiB; 2 training ranks, 1 replica; medians of {args.rounds} rounds"
    )
    print("| shape | route | GB | s | s per GB | training rank peak GiB (shard GiB) | replica peak GiB |")
    print("|---|---|---|---|---|---|---|")
    ratios = {}
    for shape in args.shapes.split(","):
        runs: dict[str, list[dict]] = {"object_store": [], "collective": []}
        for _ in range(args.rounds):
            for route in runs:
                runs[route].append(one_round(shape, route))
        for route, results in runs.items():
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            gb = med["bytes"] / 1e9
            print(
                f"| {shape} | {route} | {gb:.2f} | {med['seconds']:.2f} | {med['seconds'] / gb:.2f} | "
                f"{med['rank_peak'] / GIB:.2f} ({med['shard'] / GIB:.2f}) | {med['replica_peak'] / GIB:.2f} |"
            )
        ratios[shape] = statistics.median(r["seconds"] for r in runs["collective"]) / statistics.median(
            r["seconds"] for r in runs["object_store"]
        )
    print("collective / object_store seconds: " + ", ".join(f"{s} {r:.2f}x" for s, r in ratios.items()))


if __name__ == "__main__":
    main()
