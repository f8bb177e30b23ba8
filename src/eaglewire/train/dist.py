"""torch.distributed set-up for training. Nothing else in eaglewire imports torch.distributed.

Under `torchrun` (WORLD_SIZE set) a process group is created: gloo on CPU, nccl on CUDA. Without it,
everything degrades to one process with no collective calls. The device is the process's decision
(eaglewire.compose.device: --device, cuda when visible), never picked here again: under torchrun a CUDA
decision means each rank's own GPU, cuda:LOCAL_RANK.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str = "cpu") -> DistInfo:
    """One process on `device`, or under torchrun this rank of the group (`device` cuda: its own GPU)."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return DistInfo(device=device)
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return DistInfo(rank, world, local, f"cuda:{local}" if cuda else "cpu")


def teardown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(x: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if not info.enabled:
        return x
    x = x.clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
