"""The Triton draw (engines/runtime/sampler.py) against `engines.model.sampling.draw`, on the CPU through
Triton's interpreter (TRITON_INTERPRET=1 must be set before the kernel is defined, hence a child process),
and compiled on the GPU."""
from __future__ import annotations

import textwrap

import pytest

from tests.test_attention_kernel import asking_where_it_cannot_run_fails_clearly, run_interpreted

pytest.importorskip("triton", reason="the test extra installs triton (pip install -e '.[test]')")

# random processed logits, settings of every kind; the checks every comparison makes
CASES = """
    import torch
    from engines.model.sampling import SamplingTensors, draw

    def case(B, V, gen, device="cpu", quantize=False):
        x = torch.randn(B, V, generator=gen, device=device) * 3
        if quantize:  # bf16 logits: many equal scores
            x = x.bfloat16().float()
        x[:, 7] = float("-inf")  # a suppressed id
        x[::5, : V // 2] = float("-inf")  # rows with fewer finite ids than their top-k
        do = torch.rand(B, generator=gen, device=device) < 0.8
        temp = torch.rand(B, generator=gen, device=device) + 0.3
        topk = torch.randint(0, 80, (B,), generator=gen, device=device)
        topk[:4] = torch.tensor([0, 1, V, V + 5])
        topp = torch.where(torch.rand(B, generator=gen, device=device) < 0.5, torch.ones(B, device=device),
                           torch.rand(B, generator=gen, device=device) * 0.9 + 0.05)
        seed = torch.randint(0, 2 ** 40, (B,), generator=gen, device=device)
        step = torch.randint(0, 1000, (B,), generator=gen, device=device)
        return x, SamplingTensors(do, temp, topk, topp), seed, step

    def check(x, st, got, ref):
        # greedy rows: the argmax, exactly; sampled rows: inside the row's top-k and top-p, and as draw picks
        assert torch.equal(got[~st.do_sample], ref[~st.do_sample])
        s = x / st.temperature[:, None]
        mine = s.gather(1, got[:, None])[:, 0]
        k = torch.where(st.top_k > 0, st.top_k.clamp(max=x.shape[1]), torch.full_like(st.top_k, x.shape[1]))
        kth = s.sort(-1, descending=True).values.gather(1, (k - 1)[:, None])[:, 0]
        assert bool(((mine >= kth) | ~st.do_sample).all())
        p = torch.softmax(s.masked_fill(s < kth[:, None], float("-inf")), -1)
        better = (p * (s > mine[:, None])).sum(-1)
        assert bool(((better < st.top_p + 1e-5) | ~st.do_sample).all())
        return int((got == ref).sum())
"""


def test_kernel_draws_as_draw_does():
    """Every setting (greedy, top-k 0 / 1 / V / beyond V, top-p on and off, suppressed ids, rows with fewer
    finite ids than top-k), float and bf16-valued logits, 16 counters: the same ids as `draw` (the race uses
    the same uniforms), each inside its row's top-k and top-p."""
    out = run_interpreted(CASES + """
    from engines.runtime.attention import available  # the rule for every Triton kernel of the step
    from engines.runtime.sampler import device_draw
    assert available(torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    same = total = 0
    for V, quantize in ((300, False), (300, True), (700, True)):
        x, st, seed, step = case(48, V, gen, quantize=quantize)
        for off in (0, 1, 15):
            for digit in (1, 2, 4):  # bits per counting pass of the top-k search: the same threshold
                got = device_draw(x, st, seed, step, off, digit)
                same += check(x, st, got, draw(x, st, seed, step * 16 + off))
                total += len(got)
    print("agree", same, total)
    """)
    same, total = map(int, out.split()[1:])
    assert same >= 0.99 * total, (same, total)


def test_kernel_draw_of_a_row_does_not_depend_on_its_batch():
    out = run_interpreted(CASES + """
    from engines.runtime.sampler import device_draw
    x, st, seed, step = case(12, 500, torch.Generator().manual_seed(1))
    whole = device_draw(x, st, seed, step, 3)
    for i in range(12):
        sl = slice(i, i + 1)
        one = SamplingTensors(st.do_sample[sl], st.temperature[sl], st.top_k[sl], st.top_p[sl])
        assert device_draw(x[sl], one, seed[sl], step[sl], 3).item() == whole[i].item()
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_runner_with_the_sampling_kernel_gives_the_reference_codes_any_batch():
    """The fast step drawing every code with the kernel (the checkpoint's top-k sampling), alone and three
    at a time, both compiled-region layouts: the reference loop's sampled codes (the attention in its torch
    form: interpreting both kernels would only slow the test)."""
    out = run_interpreted("""
        import numpy as np
        from tests.test_runtime import engine, reference, requests
        from engines.runtime.runner import EngineRunner
        eng = engine()
        reqs = requests(3, greedy=False, frames=8)
        ref = reference(eng, reqs)
        for fuse in ("layer", "pass"):
            kw = dict(max_context=256, sample_kernel=True, attn_kernel=False, fuse=fuse)
            assert EngineRunner(eng, max_slots=1, **kw).model.fast.sample_kernel
            solo = [EngineRunner(eng, max_slots=1, **kw).synthesize([r])[0].codes for r in reqs]
            batched = [r.codes for r in EngineRunner(eng, max_slots=3, **kw).synthesize(reqs)]
            for s, b, (r, _) in zip(solo, batched, ref):
                assert np.array_equal(s, b) and np.array_equal(s, r), (s, b, r)
        print("same", len(reqs))
    """)
    assert out.split() == ["same", "3"]


def test_asking_for_the_sampling_kernel_where_it_cannot_run_is_a_clear_error():
    asking_where_it_cannot_run_fails_clearly("sample_kernel")


@pytest.mark.gpu
def test_gpu_kernel_draws_as_draw_does_at_real_vocabularies():
    """Compiled for the GPU: the talker's and the code predictor's vocabularies (3072, 2048), 256 rows."""
    import torch

    ns: dict = {}
    exec(textwrap.dedent(CASES), ns)
    from engines.runtime.sampler import device_draw

    gen = torch.Generator(device="cuda").manual_seed(0)
    same = total = 0
    for V in (3072, 2048):
        for quantize in (False, True):
            x, st, seed, step = ns["case"](256, V, gen, device="cuda", quantize=quantize)
            for off, digit in ((0, 2), (9, 1), (5, 4)):
                got = device_draw(x, st, seed, step, off, digit)
                same += ns["check"](x, st, got, ns["draw"](x, st, seed, step * 16 + off))
                total += len(got)
    assert same >= 0.99 * total, (same, total)
