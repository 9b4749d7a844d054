"""Ascend NPU support through torch_npu: is it there, and what is it (engines.device.graphs.NPUGraph
captures graphs on it).

NOT RUN ON HARDWARE: no Ascend machine was available; the calls follow torch_npu's documented API.
`import torch_npu` is attempted only when asked for.
"""
from __future__ import annotations

import logging

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
