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
    """CPU slots are planned at CPU_PLAN_POSITIONS each (the cache takes memory only where written), at most
    CPU_MAX_SLOTS, in half the available memory; the plan also says how many positions admitted requests may
    reserve at once (what the memory holds beside the slots' other state, at least one whole request)."""
    model, codec = _cfgs()
    planned = memory.CPU_PLAN_POSITIONS
    per = memory.per_slot_bytes(model, codec, torch.float32, planned)
    kv = memory.kv_position_bytes(model, torch.float32)
    monkeypatch.setattr(memory, "available_ram", lambda: 10**15)
    plan = memory.plan_slots(model, codec, "cpu", torch.float32, 2048)
    assert plan.slots == memory.CPU_MAX_SLOTS and "CPU" in plan.reason  # plenty: the CPU cap
    assert plan.per_slot_bytes == per and plan.positions > memory.CPU_MAX_SLOTS * 2048  # every slot at full length
    fixed = memory.fixed_bytes(model, codec, torch.float32, planned, 8, 64) - memory.GRAPH_RESERVE  # 64-frame calls
    monkeypatch.setattr(memory, "available_ram", lambda: int((fixed + 5.5 * per) / memory.CPU_HEADROOM))
    five = memory.plan_slots(model, codec, "cpu", torch.float32, 2048)
    assert five.slots == 5  # what fits in half of it
    budget = (fixed + 5.5 * per) - fixed  # half the available memory less the fixed part
    # what is left of the budget beside the 5 slots' other state, in positions: more than their planned 5 x 512
    assert five.positions >= 5 * planned and five.positions * kv + 5 * (per - planned * kv) <= budget + kv
    assert "at most %d positions" % five.positions in five.describe()
    monkeypatch.setattr(memory, "available_ram", lambda: int((fixed + 5.5 * per) / 0.9))
    assert memory.plan_slots(model, codec, "cpu", torch.float32, 2048).slots < 5  # not 90%, as a GPU's
    monkeypatch.setattr(memory, "available_ram", lambda: fixed // 4)
    small = memory.plan_slots(model, codec, "cpu", torch.float32, 2048)  # a small machine still runs one row
    assert small.slots == 1 and "1 row per step" in small.reason
    monkeypatch.setattr(memory, "available_ram", lambda: None)
    assert memory.plan_slots(model, codec, "cpu", torch.float32, 2048).slots == memory.CPU_MAX_SLOTS
    assert kv * planned < per  # (the slot's other state: text rows, codec states, frames)


def test_a_lazy_cpu_cache_takes_memory_where_written_and_gives_it_back():
    """The CPU cache (KVCache lazy) holds memory only for the positions written: a cache of 16 full-length
    rows of the 0.6B talker's shape (7 GiB if allocated) costs nothing until written; 300 positions of one
    row cost ~67 MiB; clearing the row from position 100 hands back all but those 100 (and zeroes them: the
    same values as a cache zeroed by writes), clearing it whole hands back the rest."""
    from types import SimpleNamespace

    from engines.model.kv_cache import KVCache

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no RssAnon in /proc/self/status")

    shape = SimpleNamespace(num_hidden_layers=28, num_key_value_heads=8, head_dim=128)
    base = rss_mib()
    c = KVCache.allocate(shape, 16, 2048, "cpu", torch.float32, lazy=True)
    assert rss_mib() - base < 20
    c.all_k[:, 3, :, :300] = 1.0
    c.all_v[:, 3, :, :300] = 1.0
    written = rss_mib() - base
    assert 60 < written < 90, written  # 2 x 28 x 8 x 300 x 128 x 4 bytes = 65.6 MiB
    c.clear(3, 100)
    assert rss_mib() - base < written - 35  # 200 of 300 positions handed back
    assert float(c.all_k[:, 3, :, :100].sum()) == 28 * 8 * 100 * 128 and float(c.all_k[:, 3, :, 100:].abs().sum()) == 0
    c.clear(3)
    assert rss_mib() - base < 20 and float(c.all_k.abs().sum() + c.all_v.abs().sum()) == 0
    # a row copied in with clear_rest: its positions past the copy are zero whatever the row held
    c.all_k[:, 5] = 7.0
    src = KVCache.allocate(shape, 2, 2048, "cpu", torch.float32, lazy=True)
    src.all_k[:, 1, :, :40] = 2.0
    c.copy_row(5, src, 1, 40, clear_rest=True)
    assert float(c.all_k[:, 5, :, :40].sum()) == 2.0 * 28 * 8 * 40 * 128 and float(c.all_k[:, 5, :, 40:].sum()) == 0


def test_admission_holds_requests_to_the_positions_the_memory_plan_gives():
    """With max_positions (the CPU plan's), a request joins only while every admitted request's positions
    (prompt + frame limit) fit; the others wait in the queue, in order, and run when those end; the codes
    are the reference's whatever the waiting. Batch work leaves one stream's worst case (max_context) free."""
    from engines.runtime.prepare import prepare
    from engines.runtime.sequence import Sequence
    from tests.test_runtime import reference

    eng = engine()
    reqs = requests(5, frames=6)
    reserve = []
    for r in reqs:
        probe = Sequence(None, r, 1)
        prepare(probe, eng, 128)
        reserve.append(probe.reserve)
    assert all(0 < x < 64 for x in reserve), reserve
    room = max(a + b for a, b in zip(reserve, reserve[1:]))  # any two neighbours fit, never three
    assert all(a + b + c > room for a, b, c in zip(reserve, reserve[1:], reserve[2:]))
    runner = EngineRunner(eng, max_slots=4, max_context=128, max_positions=128 + room)
    held_max, order = 0, []
    handles = [runner.submit(r, priority=1) for r in reqs]
    while not all(h.done for h in handles):
        runner.step_once()
        held = runner.slots.seqs + runner.sched.prefilling
        held_max = max(held_max, sum(s.reserve for s in held))
        order += [s.request for s in held if s.request not in order]
        assert len(held) <= 2
    assert held_max <= room and order == reqs  # in the order they came
    for h, (codes, _) in zip(handles, reference(eng, reqs)):
        assert (h.result().codes == codes).all()
