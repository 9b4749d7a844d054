"""How many slots fit: the runner's memory per slot from the model's shape, against the device's free memory.

Per slot the runner keeps the talker's KV cache (`max_context` positions), the text rows still to feed,
two codec stream states (one per codec lane) and two FrameStore rows. Besides that, independent of the
slot count: the prefill side cache, the largest codec call's activations (`batch_call_frames` frames at
24 kHz through the widest upsampling stages) and the captured graphs' pools. `auto_slots` sizes the
slot count so all of it fits in the free memory with headroom; on the CPU it is capped by cores.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

MAX_AUTO_SLOTS = 256  # beyond this the step is compute-bound: more slots only add latency
CPU_SLOTS_PER_CORE = 1


def _nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class MemoryPlan:
    slots: int
    per_slot_bytes: int
    fixed_bytes: int
    free_bytes: int
    reason: str

    def describe(self) -> str:
        gib = 2 ** 30
        return (f"{self.slots} slots ({self.per_slot_bytes / 2**20:.0f} MiB each, {self.fixed_bytes / gib:.1f} GiB "
                f"fixed, {self.free_bytes / gib:.1f} GiB free): {self.reason}")


def per_slot_bytes(engine, max_context: int, max_text_rows: int = 1024) -> int:
    tc = engine.talker.cfg
    b = _nbytes(engine.talker.codec_head.weight.dtype)
    kv = tc.num_hidden_layers * 2 * tc.num_key_value_heads * tc.head_dim * max_context * b
    text = max_text_rows * tc.hidden_size * b
    codec_state = sum(int(torch.Size(s).numel()) for s in engine.decoder.stream_state_shapes(1).values()) * b
    frames = 2 * max_context * tc.num_code_groups * 4
    return kv + text + 2 * codec_state + frames


def fixed_bytes(engine, max_context: int, prefill_batch: int, batch_call_frames: int) -> int:
    """Memory that does not grow with the slot count: prefill side cache, codec call activations, graph pools."""
    tc = engine.talker.cfg
    b = _nbytes(engine.talker.codec_head.weight.dtype)
    side = prefill_batch * tc.num_hidden_layers * 2 * tc.num_key_value_heads * tc.head_dim * max_context * b
    # the codec's last upsampling stage: frames x samples per frame x its channels, a few tensors alive
    dec = engine.decoder
    last_channels = dec.config.decoder_dim // 2 ** len(dec.config.upsample_rates)
    codec = batch_call_frames * dec.samples_per_frame * last_channels * b * 6
    graphs = 2 * 2 ** 30  # decode-step intermediates and bookkeeping of the captured graphs
    return side + codec + graphs


def auto_slots(engine, max_context: int, prefill_batch: int = 8, batch_call_frames: int = 4096,
               max_text_rows: int = 1024, headroom: float = 0.9, cap: int = MAX_AUTO_SLOTS) -> MemoryPlan:
    """The slot count for `engine` on its device: what fits in free memory (x headroom), at most `cap`;
    on the CPU one slot per core (at least 1, at most `cap`)."""
    per = per_slot_bytes(engine, max_context, max_text_rows)
    fixed = fixed_bytes(engine, max_context, prefill_batch, batch_call_frames)
    dev = engine.device
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
    elif dev.type == "npu" and hasattr(torch, "npu"):
        free, _total = torch.npu.mem_get_info(dev)
    else:
        n = max(1, min(cap, (os.cpu_count() or 1) * CPU_SLOTS_PER_CORE))
        return MemoryPlan(n, per, fixed, 0, f"CPU: {os.cpu_count()} cores")
    budget = free * headroom - fixed
    n = int(budget // per) if budget > 0 else 0
    if n < 1:
        raise RuntimeError(f"not enough free {dev.type} memory for one slot: {free / 2**30:.1f} GiB free, "
                           f"{(fixed + per) / 2**30:.1f} GiB needed; lower runtime.max_context or use a smaller model")
    reason = "fits in free memory" if n < cap else f"capped at {cap}"
    return MemoryPlan(min(n, cap), per, fixed, int(free), reason)
