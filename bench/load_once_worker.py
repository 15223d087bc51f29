"""Run under torchrun by load_once.py: save, or resume, one checkpoint of a model laid out as
``--layout`` (ddp: DistributedDataParallel; fsdp: FSDP2 over every rank; hsdp: FSDP2 on a
(dp_replicate 2, dp_shard N/2) mesh; tp_fsdp: tensor parallel 2 x FSDP2) through the checkpoint
manager. ``--mode save`` trains one step (AdamW: the optimizer has state) and saves step 1;
``--mode resume`` resumes it (``--plain``: every rank reads for itself, ``cooperative_load=False``),
``--mode time`` times ``--trials`` rounds of: the cooperative resume, the plain resume, and torch's
own ``dcp.load`` of the same state dicts (no hash checks), rotated, and rank 0 writes them as JSON
to ``--out``."""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

from ckpt_tool.core.retention import RetentionPolicy
from ckpt_tool.training.config import CheckpointConfig
from ckpt_tool.training.manager import CheckpointManager

LAYERS = 8


def build(layout: str, state_mb: float, world: int) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    # AdamW: parameters + exp_avg + exp_avg_sq = 3 x the parameters' bytes
    width = max(64, int(math.sqrt(state_mb * 2**20 / 3 / 4 / LAYERS)) // 64 * 64)
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(*(nn.Linear(width, width) for _ in range(LAYERS)))
    mesh = None
    if layout == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
        mesh = {"dp_replicate": world}
    else:
        from torch.distributed.fsdp import fully_shard

        if layout == "fsdp":
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
            dp = mesh
        elif layout == "hsdp":
            mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp_replicate", "dp_shard"))
            dp = mesh
        else:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp_shard", "tp"))
            plan = {str(i): (ColwiseParallel() if i % 2 == 0 else RowwiseParallel()) for i in range(LAYERS)}
            parallelize_module(model, mesh["tp"], plan)
            dp = mesh["dp_shard"]
        for layer in model:
            fully_shard(layer, mesh=dp)
        fully_shard(model, mesh=dp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer, mesh


def manager(
    args: argparse.Namespace, model: nn.Module, optimizer: torch.optim.Optimizer, mesh: object, cooperative: bool
) -> CheckpointManager:
    config = CheckpointConfig(
        args.dir,
        retention=RetentionPolicy(keep_last=1000),
        cooperative_load=cooperative,
        verify_on_resume=False,
        quiet=True,
        save_final=False,
    )
    return CheckpointManager(config, model=model, optimizer=optimizer, mesh=mesh)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--layout", choices=("ddp", "fsdp", "hsdp", "tp_fsdp"), required=True)
    p.add_argument("--state-mb", type=float, default=48)
    p.add_argument("--mode", choices=("save", "resume", "time"), required=True)
    p.add_argument("--plain", action="store_true")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # the bare Sequential returns a view: not trained on here
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model, optimizer, mesh = build(args.layout, args.state_mb, world)
    if args.mode == "save":
        torch.manual_seed(1 + dist.get_rank())
        width = next(model.parameters()).shape[-1]
        model(torch.randn(4, width)).square().mean().backward()
        optimizer.step()
        m = manager(args, model, optimizer, mesh, True)
        m.save(1)
        m.close()
    elif args.mode == "resume":
        m = manager(args, model, optimizer, mesh, not args.plain)
        assert m.resume() == 1
        m.close()
    else:
        times: dict[str, list[float]] = {"cooperative": [], "plain": [], "dcp.load": []}
        step_dir = args.dir / "step_00000001"
        for trial in range(args.trials):
            variants = list(times)
            for variant in variants[trial % 3 :] + variants[: trial % 3]:
                model, optimizer, mesh = build(args.layout, args.state_mb, world)
                dist.barrier()
                start = time.perf_counter()
                if variant == "dcp.load":
                    msd, osd = get_state_dict(model, optimizer)
                    state = {"model": msd, "optim": osd}
                    dcp.load(state, checkpoint_id=step_dir)
                    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
                else:
                    m = manager(args, model, optimizer, mesh, variant == "cooperative")
                    assert m.resume() == 1
                dist.barrier()
                times[variant].append(time.perf_counter() - start)
                if variant != "dcp.load":
                    m.close()
        if dist.get_rank() == 0 and args.out:
            args.out.write_text(json.dumps(times))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
