"""The peers benchmark's training (``workload``) under Lightning 2.6.6, as its documentation writes
it: a ``LightningModule``, ``Trainer(strategy="ddp")`` on the CPU (gloo), ``ModelCheckpoint`` every
``SAVE_EVERY`` steps. Under SLURM (``SLURM_JOB_ID`` set) it adds ``SLURMEnvironment(auto_requeue=
True)``: SIGUSR1 to the job's steps (``#SBATCH --signal=SIGUSR1@90``, Lightning's documented
setting) saves ``hpc_ckpt_N.ckpt`` and rank 0 runs ``scontrol requeue``; the requeued job's
``fit(ckpt_path=None)`` finds that checkpoint and resumes from it. Each srun task is one rank
(``srun --ntasks-per-node 2``); outside SLURM, Lightning starts rank 1 itself.

    srun python bench/peers/lightning_train.py CKPT_DIR STEPS_DIR STEPS     # under sbatch
    python bench/peers/lightning_train.py CKPT_DIR STEPS_DIR STEPS          # alone: 2 ranks

The batch of a step is ``workload.batch(global_step + 1, rank)`` (drawn in ``training_step``), so a
resumed run trains on the same batches as every other framework; the data loader only paces the
steps. Lightning restarts nothing by itself after a crash: the job ends.
"""

from __future__ import annotations

import os
import sys

import lightning as L
import torch
import workload
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment


class Module(L.LightningModule):
    """The workload's model and optimizer, one step a batch, a step-log line per trained step."""

    def __init__(self, steps_dir: str) -> None:
        super().__init__()
        self.model = workload.build()
        self.steps_dir = steps_dir
        self.log_file: workload.StepLog | None = None

    def training_step(self, _: torch.Tensor, __: int) -> torch.Tensor:
        return workload.gpt.lm_loss(self.model, workload.batch(self.global_step + 1, self.global_rank))

    def on_train_batch_end(self, outputs: dict, _: torch.Tensor, __: int) -> None:
        if self.log_file is None:
            self.log_file = workload.StepLog(self.steps_dir, self.global_rank)
        self.log_file.step(self.global_step, float(outputs["loss"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return workload.optimizer(self.model)


def main(argv: list[str]) -> None:
    args = workload.parse(argv)
    under_slurm = "SLURM_JOB_ID" in os.environ
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("SLURM_NTASKS_PER_NODE", "2")),
        strategy="ddp",
        max_steps=args.steps,
        default_root_dir=str(args.ckpt_dir),  # where the SIGUSR1 checkpoint goes and is looked for
        callbacks=[
            ModelCheckpoint(dirpath=str(args.ckpt_dir / "ckpt"), every_n_train_steps=workload.SAVE_EVERY, save_last=True, save_top_k=-1)
        ],
        plugins=[SLURMEnvironment(auto_requeue=True)] if under_slurm else [],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    steps = torch.utils.data.DataLoader(torch.zeros(args.steps), batch_size=1)
    trainer.fit(Module(str(args.steps_dir)), steps, ckpt_path=None if under_slurm else "last")


if __name__ == "__main__":
    main(sys.argv[1:])
