"""Ascend NPU support through torch_npu: detection and an NPUGraph with the DeviceGraph interface.

NOT RUN ON HARDWARE: no Ascend machine was available; the calls follow torch_npu's documented API
(`torch_npu.npu.NPUGraph`, the `torch_npu.npu.graph(g, pool=, stream=)` context manager, streams
mirroring torch.cuda). The capture logic itself is shared with CudaGraph (engines.device.graphs)
and tested on CPU with a stand-in namespace. `import torch_npu` is attempted only when asked for.
"""
from __future__ import annotations

import logging

from engines.device.graphs import StreamGraph

log = logging.getLogger(__name__)


def import_torch_npu():
    """The torch_npu module, or None when it is not installed or fails to load (logged at debug)."""
    try:
        import torch_npu
    except Exception as exc:  # ImportError, or a CANN/driver load error raised from the extension
        log.debug("torch_npu not usable: %s", exc)
        return None
    return torch_npu


def npu_available() -> bool:
    tn = import_torch_npu()
    try:
        return bool(tn is not None and tn.npu.is_available())
    except Exception as exc:
        log.debug("torch_npu.npu.is_available() failed: %s", exc)
        return False


def npu_info() -> dict:
    """What the build manifest records about the Ascend device (empty when there is none)."""
    tn = import_torch_npu()
    if tn is None or not npu_available():
        return {}
    info = {"torch_npu": getattr(tn, "__version__", "?"), "device_count": tn.npu.device_count()}
    try:
        info["device_name"] = tn.npu.get_device_name(0)
    except Exception as exc:
        info["device_name"] = f"unknown ({exc})"
    return info


class NPUGraph(StreamGraph):
    """torch_npu.npu.NPUGraph behind the DeviceGraph interface (capture / replay, static buffers)."""

    kind = "npu"

    def __init__(self, device="npu", pool=None):
        tn = import_torch_npu()
        if tn is None:
            raise RuntimeError("NPU graphs need torch_npu (Ascend's PyTorch adapter) and the CANN toolkit; "
                               "install them, or use device 'cpu' / 'cuda'")
        import torch

        super().__init__(torch.device(device), tn.npu, tn.npu.NPUGraph, pool)
