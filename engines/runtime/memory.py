"""How many slots fit: the runner's memory per slot from the model's shape, against the device's free memory.

Per slot the runner keeps the talker's KV cache (`max_context` positions; `runtime.kv_cache: fp8` about
halves it: one byte per element and a float32 scale per 128-element vector), the text rows still to feed,
two codec stream states (one per codec lane) and two FrameStore rows. Besides that, independent of the
slot count: the prefill side cache, the largest codec call's activations in each of the two codec lanes (`batch_call_frames` frames at
24 kHz through the last upsampling stage) and the captured graphs' pools. `plan_slots` sizes the slot
count so all of it fits in the free memory with headroom (before or after the weights are loaded). On
the CPU the free memory is the system's available memory, and the count is at most CPU_MAX_SLOTS: a CPU step
reads every weight once whatever its rows, so a book wants many rows per step (docs/PERFORMANCE.md, "Books
on the CPU": 434 ms per frame-row at 2 rows, 45 ms at 64, fp32, 2 cores).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from engines.model.config import CodecConfig, ModelConfig
from engines.model.kv_cache import SCALE_DTYPE
from engines.runtime.config import EngineConfig

log = logging.getLogger(__name__)

MAX_AUTO_SLOTS = 256  # beyond this a step is compute-bound: more slots only add latency
CPU_HEADROOM = 0.5  # CPU: the slots take at most half the memory available at start (the machine has other work)
CPU_MAX_SLOTS = 64  # CPU: rows per step past which the time per frame-row hardly falls (and a step takes seconds)
# CPU: positions a slot is planned at. A CPU cache takes memory only where it is written (KVCache lazy), and
# admission reserves each request's own worst case (prompt + frame limit) against the plan's `positions`:
# a book segment (a paragraph of at most 300 characters: ~60 prompt positions, ~250 frames) fits in 512
CPU_PLAN_POSITIONS = 512
GRAPH_RESERVE = 2 * 2**30  # decode-step intermediates and bookkeeping of the captured graphs
CODEC_LIVE_TENSORS = 8  # activations of the last upsampling stage alive at once in a codec call


def _nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class MemoryPlan:
    slots: int
    per_slot_bytes: int
    fixed_bytes: int
    free_bytes: int
    reason: str
    positions: int = 0  # CPU: key/value positions all requests may reserve at once (0: no limit but the slots')

    def describe(self) -> str:
        gib = 2 ** 30
        free = f", {self.free_bytes / gib:.1f} GiB free" if self.free_bytes else ""
        held = f", at most {self.positions} positions reserved at once" if self.positions else ""
        return (f"{self.slots} slots ({self.per_slot_bytes / 2**20:.0f} MiB each, {self.fixed_bytes / gib:.1f} GiB "
                f"fixed{free}{held}): {self.reason}")

    def as_dict(self) -> dict:
        return {"slots": self.slots, "per_slot_mib": round(self.per_slot_bytes / 2**20, 1),
                "fixed_gib": round(self.fixed_bytes / 2**30, 2), "free_gib": round(self.free_bytes / 2**30, 2),
                "positions": self.positions, "reason": self.reason}


def _codec_state_values(codec: CodecConfig) -> int:
    from engines.codec.export import state_specs

    return sum(math.prod(s) for s in state_specs(codec.decoder, 1).values())


def kv_position_bytes(model: ModelConfig, dtype: torch.dtype, kv_cache: str = "auto") -> int:
    """Bytes of one position of the talker's key/value cache over its layers: keys and values in the model's
    dtype, or (kv_cache "fp8") one byte per element plus a float32 scale per vector (engines.model.kv_cache)."""
    tc = model.talker
    vectors = tc.num_hidden_layers * 2 * tc.num_key_value_heads
    if kv_cache == "fp8":
        return vectors * (tc.head_dim + _nbytes(SCALE_DTYPE))
    return vectors * tc.head_dim * _nbytes(dtype)


def per_slot_bytes(model: ModelConfig, codec: CodecConfig, dtype: torch.dtype, max_context: int,
                   max_text_rows: int = 1024, kv_cache: str = "auto") -> int:
    tc, b = model.talker, _nbytes(dtype)
    kv = kv_position_bytes(model, dtype, kv_cache) * max_context
    text = max_text_rows * tc.hidden_size * b
    frames = 2 * max_context * tc.num_code_groups * 4
    return kv + text + 2 * _codec_state_values(codec) * b + frames


def fixed_bytes(model: ModelConfig, codec: CodecConfig, dtype: torch.dtype, max_context: int, prefill_batch: int,
                batch_call_frames: int, kv_cache: str = "auto") -> int:
    """Memory that does not grow with the slot count: prefill side cache, codec call activations, graph pools."""
    b = _nbytes(dtype)
    side = prefill_batch * kv_position_bytes(model, dtype, kv_cache) * max_context
    d = codec.decoder
    spf = math.prod(d.upsample_rates) * math.prod(d.upsampling_ratios)
    last_channels = d.decoder_dim // 2 ** len(d.upsample_rates)
    # two codec lanes (streams, batch work), each with its own graph pool: their calls may run at once
    return side + 2 * batch_call_frames * spf * last_channels * b * CODEC_LIVE_TENSORS + GRAPH_RESERVE


def weights_bytes(model_dir: str | Path, dtype: torch.dtype) -> int:
    """What loading the checkpoint's weights in `dtype` will take (from the safetensors headers)."""
    from safetensors import SafetensorError, safe_open

    from engines.model.errors import CheckpointError

    total = 0
    for f in (Path(model_dir) / "model.safetensors", Path(model_dir) / "speech_tokenizer" / "model.safetensors"):
        if f.is_file():
            try:
                with safe_open(str(f), framework="pt") as st:
                    for name in st.keys():
                        total += math.prod(st.get_slice(name).get_shape())
            except (SafetensorError, OSError, ValueError) as exc:  # the loader's words for it
                raise CheckpointError(f"corrupt checkpoint file {f}: {exc}") from exc
    return total * _nbytes(dtype)


def device_free_bytes(device: torch.device) -> Optional[int]:
    """Free memory of the device: an accelerator's, or on the CPU the system's available memory (None where
    it cannot be read)."""
    if device.type == "cpu":
        return available_ram()
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "npu" and hasattr(torch, "npu"):
        return torch.npu.mem_get_info(device)[0]
    return None


def available_ram(meminfo: Path = Path("/proc/meminfo")) -> Optional[int]:
    """The memory the system can give without swapping (MemAvailable), in bytes; None where unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def plan_slots(model: ModelConfig, codec: CodecConfig, device, dtype: torch.dtype, max_context: int,
               prefill_batch: int = 8, batch_call_frames: int = 1024, max_text_rows: int = 1024,
               still_to_load: int = 0, headroom: float = 0.9, cap: int = MAX_AUTO_SLOTS,
               kv_cache: str = "auto") -> MemoryPlan:
    """The slot count on `device`: what fits in its free memory (x headroom, less `still_to_load` bytes of
    weights not loaded yet), at most `cap`; on the CPU what fits in CPU_HEADROOM of the available memory (at
    least 1), at most CPU_MAX_SLOTS (and `cap`). `kv_cache`: runtime.kv_cache (fp8: the talker's cache at about half the bytes)."""
    device = torch.device(device)
    cpu = device.type == "cpu"
    # CPU: the cache is lazy (memory where written) and admission holds requests to `positions`: slots are
    # planned at CPU_PLAN_POSITIONS each (kv_cache fp8 is not lazy: planned at the full context)
    planned = min(max_context, CPU_PLAN_POSITIONS) if cpu and kv_cache != "fp8" else max_context
    per = per_slot_bytes(model, codec, dtype, planned, max_text_rows, kv_cache)
    if cpu:  # the CPU's codec calls are shorter (EngineConfig.cpu_call_frames)
        batch_call_frames = min(batch_call_frames, EngineConfig.cpu_call_frames)
    fixed = fixed_bytes(model, codec, dtype, planned, prefill_batch, batch_call_frames, kv_cache)
    free = device_free_bytes(device)
    if cpu:
        fixed -= GRAPH_RESERVE  # no device graphs on the CPU
        cap, headroom = min(cap, CPU_MAX_SLOTS), min(headroom, CPU_HEADROOM)
        if free is None:
            return MemoryPlan(cap, per, fixed, 0, f"CPU: {cap} rows per step (available memory unknown)")
    budget = free * headroom - fixed - still_to_load
    n = int(budget // per) if budget > 0 else 0
    if n < 1 and cpu:  # the CPU runs as it did with one slot per core: one row at least, no refusal
        return MemoryPlan(1, per, fixed, int(free), f"CPU: 1 row per step: {headroom:.0%} of the available memory "
                          "holds no more")
    if n < 1:
        raise RuntimeError(f"not enough free {device.type} memory for one slot: {free / 2**30:.1f} GiB free, "
                           f"{(fixed + per + still_to_load) / 2**30:.1f} GiB needed; lower runtime.max_context, "
                           "use a smaller model or free the device")
    reason = f"what fits in {headroom:.0%} of the free memory" if n < cap else f"capped at {cap}"
    if not cpu:
        return MemoryPlan(min(n, cap), per, fixed, int(free), reason)
    slots = min(n, cap)
    kv = kv_position_bytes(model, dtype, kv_cache)
    positions = 0 if planned == max_context else max(int((budget - slots * (per - planned * kv)) // kv), max_context)
    return MemoryPlan(slots, per, fixed, int(free), f"CPU: {reason} (a CPU step reads every weight once: more rows "
                      "per step, more audio per second)", positions)


def plan_for_engine(engine, max_context: int, **kw) -> MemoryPlan:
    """`plan_slots` for a loaded engine (its weights already on the device)."""
    return plan_slots(engine.cfg, engine.codec_cfg, engine.device, engine.talker.codec_head.weight.dtype,
                      max_context, **kw)
