"""What ``ckpt run`` runs: its configuration and the torchrun command line it builds from it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_tool.core.node_ledger import DEFAULT_SUSPECT_AFTER
from ckpt_tool.core.stragglers import StragglerPolicy
from ckpt_tool.core.timeouts import TimeoutPolicy
from ckpt_tool.errors import CkptError, ExitCode
from ckpt_tool.supervise import round_end
from ckpt_tool.supervise.channel import ENV_SOCKET
from ckpt_tool.supervise.handoff import ENV_POOL
from ckpt_tool.supervise.stacks import ENV_STACKS

ELASTIC_LAST_CALL_S = 10


@dataclass(frozen=True)
class RunConfig:
    """Everything ``ckpt run`` needs: the training command, directories, torchrun's layout and rendezvous, the
    restart and crash-loop limits, seconds for the grace, stop deadline and poll, timeouts and straggler
    policies. Raises ``CkptError`` (USAGE) at construction for an empty command or a count out of range."""

    command: tuple[str, ...]  # the training script and its arguments, or ("-m", module, ...)
    run_dir: Path
    ckpt_dir: Path | None = None  # exported to the ranks as CKPT_DIR; its LATEST names the newest checkpoint
    nproc_per_node: int = 1
    nnodes: str = "1"
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 3
    crash_loop: int = 3
    grace_s: float = 5.0
    stop_deadline_s: float = 300.0
    poll_s: float = 0.2
    timeouts: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    node: str = field(default_factory=round_end.node_name)  # SLURM's node name, else the host name
    round_id: str = field(default_factory=round_end.round_id)  # one srun step: every node's ckpt run shares it
    suspect_after: int = DEFAULT_SUSPECT_AFTER
    warm: bool = True  # pre-warmed spare rank processes (supervise.warm_pool)
    warm_imports: tuple[str, ...] = ()  # more modules for the spares to import (the user's heavy ones)
    stragglers: StragglerPolicy = field(default_factory=StragglerPolicy)
    straggler_suspect: bool = False  # a straggling node is suspect: checkpoint, end the round, leave it behind
    gpu_monitor: bool = True  # read the node's GPUs through NVML when there are any

    def __post_init__(self) -> None:
        if not self.command:
            raise CkptError(
                "no training script given", "usage: ckpt run [OPTIONS] -- train.py ARGS (or -- -m package.module ARGS)", ExitCode.USAGE
            )
        if self.nproc_per_node < 1 or self.max_restarts < 0 or self.crash_loop < 1 or self.suspect_after < 1:
            raise CkptError(
                "--nproc-per-node, --crash-loop and --suspect-after must be >= 1, --max-restarts >= 0",
                "see `ckpt run --help`",
                ExitCode.USAGE,
            )


def rank_environment(cfg: RunConfig, base: dict[str, str], sock_path: Path, pool_dir: Path) -> dict[str, str]:
    """The environment torchrun and the ranks get: the heartbeat socket (its directory also holds
    the ranks' stack dumps), the run and checkpoint directories, the spare pool's directory (when warm)."""
    # A fresh store for every rendezvous round: torchrun's shared store keeps the keys of earlier
    # rounds, and when another node's failure restarts this node's ranks, the restart count
    # that would separate them is not raised (measured: gloo then dials the dead ranks).
    env = {
        **base,
        ENV_SOCKET: str(sock_path),
        ENV_STACKS: str(sock_path.parent / "stacks"),
        "CKPT_RUN_DIR": str(cfg.run_dir),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    # NCCL's flight recorder records the last collectives of each rank (gloo has none): on by
    # default, dumped into hangs/ when NCCL's own watchdog times out (python -m
    # torch.distributed.flight_recorder.fr_trace reads the files).
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(cfg.run_dir / "hangs" / "flight_recorder_rank_"))
    if cfg.ckpt_dir is not None:
        env["CKPT_DIR"] = str(cfg.ckpt_dir)
    if cfg.warm:
        env[ENV_POOL] = str(pool_dir)
    return env


def torchrun_argv(cfg: RunConfig, python: str = sys.executable) -> list[str]:
    """The torchrun command line for one node. Single node without an endpoint: --standalone."""
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={cfg.nproc_per_node}",
        f"--max-restarts={cfg.max_restarts}",
        "--monitor-interval=0.2",
    ]
    if cfg.rdzv_endpoint is None and cfg.nnodes == "1":
        argv.append("--standalone")
    else:
        argv += [
            f"--nnodes={cfg.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={cfg.rdzv_endpoint}",
            f"--rdzv-id={cfg.rdzv_id or 'ckpt'}",
        ]
        if ":" in cfg.nnodes:
            # An elastic range (MIN:MAX): when a node's agent is lost the others go on without it.
            # torchrun waits last_call_timeout (30 s by default) for more nodes once MIN are there;
            # measured: a lost agent cost 48 s before the survivors resumed. 10 s still lets every
            # node of a starting job join (they start together under srun).
            argv.append(f"--rdzv-conf=last_call_timeout={ELASTIC_LAST_CALL_S}")
    launcher = ["-m", "ckpt_tool.supervise.handoff"] if cfg.warm else []
    return argv + launcher + list(cfg.command)
