"""One rank of the two-process (gloo, CPU) routing centroid check; kept apart from the test module
so that the spawned processes import only torch and the routing mixer."""
from __future__ import annotations

import torch
import torch.distributed as dist

from attention.routing import RoutingAttention


def routing_rank(rank: int, port: int, settings: dict, inputs: list, out_dir: str) -> None:
    """Rank ``rank`` runs one training forward on its own ``inputs[rank]`` (q, k, v, mask) and saves
    its centroids to ``out_dir/rank<r>.pt``."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        mixer = RoutingAttention(**settings).double().train()
        q, k, v, mask = inputs[rank]
        mixer(q, k, v, mask, None)
        torch.save(mixer.centroids.clone(), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
