"""GPU readings for the watchdog: NVML through nvidia-ml-py (the optional ``gpu`` extra).

``open_reader()`` returns a ``GpuReader`` and, when there is none (no nvidia-ml-py, no driver, no
GPU), the reason: the watchdog says it once and the rest of its work goes on. A reader gives,
per sample, each device's utilisation, memory used, uncorrectable ECC count and the critical
XID errors the driver reported since the last sample. ``CKPT_FAKE_NVML=FILE`` swaps in a reader
of FILE (JSON, re-read at every sample: ``{"gpus": [{"index": 0, "util": 97, "xids": [79]}]}``),
for tests and demos on machines without a GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from ckpt_tool.core.gpu_findings import GpuSample

ENV_FAKE = "CKPT_FAKE_NVML"


class GpuReader(Protocol):
    """What the watchdog reads GPUs through (``NvmlReader``, or ``FakeReader`` in tests); ``open_reader`` gives one."""

    def sample(self) -> dict[int, GpuSample]:
        """One reading of each device, by NVML device index; a device that cannot be read is left out."""

    def index_of(self, device: str) -> int | None:
        """The NVML index of a ``CUDA_VISIBLE_DEVICES`` entry (an index or a UUID); None when no device matches."""

    def close(self) -> None:
        """Release the reader's resources; no sample after it."""


def device_of_local_rank(local_rank: int, cuda_visible: str | None) -> str:
    """The device a local rank uses by the usual convention (``cuda:LOCAL_RANK`` of the devices
    CUDA_VISIBLE_DEVICES shows), as that variable names it: an index or a UUID."""
    visible = [d.strip() for d in (cuda_visible or "").split(",") if d.strip()]
    return visible[local_rank] if local_rank < len(visible) else str(local_rank)


class FakeReader:
    """Readings from the JSON file ``CKPT_FAKE_NVML`` names, re-read at each sample: what tests and
    machines without GPUs use. Shape: ``{"gpus": [{"index", "util", "memory_used", "ecc_uncorrected", "xids"}]}``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def sample(self) -> dict[int, GpuSample]:
        """The file's readings now; empty when it is missing or malformed (never raises)."""
        try:
            data = json.loads(self.path.read_text())
            return {
                int(g["index"]): GpuSample(
                    int(g["index"]),
                    float(g.get("util", 0)),
                    int(g.get("memory_used", 0)),
                    int(g.get("ecc_uncorrected", 0)),
                    tuple(int(x) for x in g.get("xids", ())),
                )
                for g in data["gpus"]
            }
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def index_of(self, device: str) -> int | None:
        """A numeric entry as the index; None for a UUID (the file has none)."""
        return int(device) if device.isdigit() else None

    def close(self) -> None:
        """Nothing to release."""


class NvmlReader:
    """The node's GPUs through NVML (the ``pynvml`` module of nvidia-ml-py): initialises NVML and subscribes
    to critical XID events where the device supports them. Raises ``NVMLError`` when NVML cannot start
    (``open_reader`` turns that into a reason)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())}
        self.events = nvml.nvmlEventSetCreate()
        for handle in self.handles.values():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self.events)
            except nvml.NVMLError:
                pass  # not supported on this device: utilisation and ECC still are

    def _xids(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        while True:
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:  # NVML_ERROR_TIMEOUT: no event waiting
                return out
            out.setdefault(self.nvml.nvmlDeviceGetIndex(data.device), []).append(int(data.eventData))

    def sample(self) -> dict[int, GpuSample]:
        """Utilisation (%), memory used (bytes), the volatile uncorrected ECC count (0 where ECC is off) and
        the critical XIDs since the last sample, per device; a device NVML fails to read is left out."""
        nvml, xids, out = self.nvml, self._xids(), {}
        for i, h in self.handles.items():
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                used = int(nvml.nvmlDeviceGetMemoryInfo(h).used)
            except nvml.NVMLError:
                continue
            try:
                ecc = int(nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
            except nvml.NVMLError:
                ecc = 0  # ECC off or not supported
            out[i] = GpuSample(i, util, used, ecc, tuple(xids.get(i, ())))
        return out

    def index_of(self, device: str) -> int | None:
        """The index of a ``CUDA_VISIBLE_DEVICES`` entry: a number as is, a UUID by asking each device; None
        when none matches."""
        if device.isdigit():
            return int(device)
        for i, h in self.handles.items():
            try:
                if self.nvml.nvmlDeviceGetUUID(h) == device:
                    return i
            except self.nvml.NVMLError:
                continue
        return None

    def close(self) -> None:
        """Free the event set and shut NVML down; NVML errors are ignored."""
        try:
            self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def open_reader(environ: dict[str, str] | None = None) -> tuple[GpuReader | None, str]:
    """(a reader, "") or (None, why there is none)."""
    env = os.environ if environ is None else environ
    if env.get(ENV_FAKE):
        return FakeReader(Path(env[ENV_FAKE])), ""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'ckpt-tool[gpu]')"
    try:
        reader = NvmlReader(pynvml)
    except pynvml.NVMLError as exc:
        return None, f"NVML unavailable: {exc} (no NVIDIA driver or GPU on this node)"
    if not reader.handles:
        reader.close()
        return None, "NVML sees no GPU on this node"
    return reader, ""
