"""ckpt-tool: checkpointing and fault recovery for distributed PyTorch training on SLURM."""

__version__ = "0.1.0"
