"""Offline operations on a checkpoint directory, run by the ``ckpt`` commands (never inside the
training loop): rollback, recover, reshard, verify. They build on ``training`` (the safe DCP
reader, the full validation, the probe) and ``store``."""
