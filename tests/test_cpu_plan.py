"""The CPU's own choices: slots by available memory (many rows per step), exact step and codec-call shapes."""
from __future__ import annotations

import torch

from engines.model.config import CodecConfig, CodecDecoderConfig
from engines.runtime import memory
from engines.runtime.runner import EngineRunner
from tests.test_runtime import engine, requests


def _cfgs():
    eng = engine()
    return eng.cfg, CodecConfig(decoder=CodecDecoderConfig(), encoder={})


def test_available_ram_reads_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    assert memory.available_ram(f) == 20000000 * 1024
    f.write_text("garbage\n")
    assert memory.available_ram(f) is None
    assert memory.available_ram(tmp_path / "absent") is None


def test_cpu_slots_follow_available_memory(monkeypatch):
    model, codec = _cfgs()
    per = memory.per_slot_bytes(model, codec, torch.float32, 2048)
    monkeypatch.setattr(memory, "available_ram", lambda: 10**15)
    plan = memory.plan_slots(model, codec, "cpu", torch.float32, 2048)
    assert plan.slots == memory.CPU_MAX_SLOTS and "CPU" in plan.reason  # plenty: the CPU cap
    fixed = memory.fixed_bytes(model, codec, torch.float32, 2048, 8, 64) - memory.GRAPH_RESERVE  # CPU: 64-frame calls
    monkeypatch.setattr(memory, "available_ram", lambda: int((fixed + 5.5 * per) / memory.CPU_HEADROOM))
    assert memory.plan_slots(model, codec, "cpu", torch.float32, 2048).slots == 5  # what fits in half of it
    monkeypatch.setattr(memory, "available_ram", lambda: int((fixed + 5.5 * per) / 0.9))
    assert memory.plan_slots(model, codec, "cpu", torch.float32, 2048).slots < 5  # not 90%, as a GPU's
    monkeypatch.setattr(memory, "available_ram", lambda: fixed // 4)
    small = memory.plan_slots(model, codec, "cpu", torch.float32, 2048)  # a small machine still runs one row
    assert small.slots == 1 and "1 row per step" in small.reason
    monkeypatch.setattr(memory, "available_ram", lambda: None)
    assert memory.plan_slots(model, codec, "cpu", torch.float32, 2048).slots == memory.CPU_MAX_SLOTS


def test_cpu_steps_and_codec_calls_take_exact_shapes():
    """Nothing is captured on the CPU: a step over 3 rows runs 3 rows (not a bucket of 4) at the exact cache
    length, and a codec call takes the frames due (not a power of two). (Codes and audio against the
    reference on the CPU: tests/test_runtime.py.)"""
    runner = EngineRunner(engine(), max_slots=3, max_context=256)
    assert runner.model.exact and runner.lanes["batch"].exact
    assert runner.lanes["batch"].chunk_cap(1, 48) == 48 and runner.lanes["batch"].chunk_cap(3, 48) == 16
    [runner.submit(r, priority=1) for r in requests(3, frames=9)]
    while runner.slots.n_active < 3:
        runner.step_once()
    assert runner.model.bucket(runner.slots.seqs, 3) == (3, max(s.pos for s in runner.slots.seqs) + 2)
