"""Quality guard of the narrower numbers: how often bf16 picks the same codes as fp32, and how often the fp8
key/value cache (bf16 weights, `runtime.kv_cache: fp8`) picks the same codes as bf16, on the same weights and
inputs. fp8 is adopted only where its agreement with bf16 is as good as bf16's with fp32; the CPU's packed
decoder-layer weights (`runtime.linear`: fp16, int8) are measured against fp32 the same way and compared with
bf16's figure (`runtime.linear: auto` takes a format only where it holds: engines.runtime.linears).

    python -m benchmarks.bf16_agreement --model tests/data/tiny/cv_small --device cpu
    python -m benchmarks.bf16_agreement --dummy 0.6b --device cuda
    python -m benchmarks.bf16_agreement --dummy 0.6b --device cpu --frames 20 \
        --pairs bf16_vs_fp32,fp16_vs_fp32,int8_vs_fp32

Pairs (test against reference): bf16_vs_fp32 (bf16 weights and cache against fp32), fp8_vs_bf16 (bf16 weights
with the fp8 cache against bf16 with its bf16 cache), fp8_vs_fp32, fp16_vs_fp32 / int8_vs_fp32 (fp32 with the
decoder layers' weights in that format: the reference modules' linears replaced by their packed form for the
teacher-forced measure, the runner with that runtime.linear for the free-running one). Two measures each,
both greedy:
- teacher-forced: the reference's own greedy codes (eager loop) are fed back to both, and at every frame and
  codebook we compare the argmax each would pick (independent of earlier disagreements: the per-decision
  agreement);
- free-running: the test's batched runtime (CUDA graphs on a GPU) generates on its own; we report the share of
  requests identical to the reference's eager codes and the mean fraction of frames before the first difference.
Random weights make many logits near-ties, so these rates are a lower bound for a trained checkpoint.
"""
from __future__ import annotations

import argparse
import json
import logging

import numpy as np
import torch

from engines.api import SamplingParams, SynthesisRequest

log = logging.getLogger("bf16_agreement")

TEXTS = ["Hello world, this is a test of the speech engine.", "The river shone like a ribbon of glass.",
         "Numbers such as twelve and forty-two are spoken in full.", "Nobody remembered who planted the trees.",
         "She folded the letter twice and hid it under the loose floorboard.", "Rain again, said the porter.",
         "At dawn the harbour filled with boats returning from the night's catch.", "Why would anyone wait?"]


@torch.no_grad()
def teacher_forced_picks(eng, req: SynthesisRequest, codes: torch.Tensor, fp8: bool = False) -> torch.Tensor:
    """Greedy picks `[F, 16]` of `eng` (`fp8`: with the fp8 talker cache) when the reference `codes` `[F, 16]`
    are the history."""
    talker, dev = eng.talker, eng.device
    spec, _ = eng.resolve(req)
    prompt = eng.prompts.build(spec)
    t = prompt.prefill.shape[0]
    cache = talker.new_cache(1, t + codes.shape[0] + 1, dev, prompt.prefill.dtype, fp8)
    hidden, logits = talker(prompt.prefill[None], torch.arange(t, device=dev)[None], cache)
    cp, picks = talker.code_predictor, []
    codes = codes.to(dev)
    for f in range(codes.shape[0]):
        row = [logits[0].float().argmax()]
        ccache = cp.new_cache(1, dev, hidden.dtype)
        lg = cp.prefill(hidden, talker.codec_embed(codes[f:f + 1, 0]), ccache)
        for j in range(cp.num_steps):
            row.append(lg[0].float().argmax())
            if j + 1 < cp.num_steps:
                lg = cp.step(j + 1, cp.embed(j, codes[f:f + 1, j + 1]), ccache)
        picks.append(torch.stack(row))
        text = prompt.trailing[f] if f < prompt.trailing.shape[0] else prompt.pad
        x = (talker.frame_embed(codes[f:f + 1]) + text)[:, None]
        hidden, logits = talker(x, torch.tensor([[t + f]], device=dev), cache)
    return torch.stack(picks).cpu()


def load(args, dtype):
    if args.model:
        from engines.engine import TTSEngine

        return TTSEngine.load(args.model, device=args.device, dtype=dtype)
    from benchmarks.dummy_engine import dummy_engine

    return dummy_engine(args.dummy, args.device, dtype)


PACKED = ("fp16", "int8")  # runtime.linear formats measured against fp32


def packed_engine(args, fmt: str):
    """The fp32 engine with its decoder layers' linears in `fmt` (the reference form of runtime.linear: fmt)."""
    from engines.runtime.linears import pack_heads, pack_modules

    eng = load(args, "float32")
    pack_modules(eng.talker.model, fmt)
    pack_modules(eng.talker.code_predictor.model, fmt)
    pack_heads(eng.talker, fmt)
    return eng


def pair(ref_eng, ref_fp8: bool, test_eng, test_fp8: bool, reqs: list, runner_eng=None, linear: str = "model",
         free: bool = True) -> dict:
    """The two measures of `test` against `ref` (each an engine and whether its talker cache is fp8);
    `runner_eng`, `linear`: the engine and runtime.linear the free-running measure runs (default: `test_eng`)."""
    from engines.runtime.runner import EngineRunner

    ref = [g.codes for g, _ in ref_eng.generate_codes(reqs, fp8=ref_fp8)]
    tf = torch.cat([(teacher_forced_picks(ref_eng, req, codes, ref_fp8) ==
                     teacher_forced_picks(test_eng, req, codes, test_fp8)).float()
                    for req, codes in zip(reqs, ref)])  # [frames, 16]
    out = {"teacher_forced_codebook0": float(tf[:, 0].mean()),
           "teacher_forced_codebooks1_15": float(tf[:, 1:].mean()), "teacher_forced_all": float(tf.mean()),
           "teacher_forced_decisions": tf.numel()}
    if not free:
        return out
    runner = EngineRunner(runner_eng or test_eng, max_slots=len(reqs), max_context=512,
                          kv_cache="fp8" if test_fp8 else "model", linear=linear)
    free = [r.codes for r in runner.synthesize(reqs)]
    same_prefix = []
    for r, c in zip(ref, free):
        r = r.numpy()
        n = min(len(r), len(c))
        diff = np.nonzero((r[:n] != c[:n]).any(1))[0]
        same_prefix.append((diff[0] if len(diff) else n) / max(len(r), 1))
    return out | {"free_running_identical_requests": sum(int(np.array_equal(r.numpy(), c)) for r, c in zip(ref, free)),
            "free_running_requests": len(reqs), "free_running_mean_prefix": float(np.mean(same_prefix))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--pairs", default="bf16_vs_fp32,fp8_vs_bf16,fp8_vs_fp32")
    ap.add_argument("--requests", type=int, default=len(TEXTS), help="how many of the texts (at most 8)")
    ap.add_argument("--free-running", action=argparse.BooleanOptionalAction, default=True,
                    help="also the free-running measure (off: teacher-forced only; bf16 on a CPU without bf16 "
                         "instructions takes long)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    names = {n for p in args.pairs.split(",") for n in p.split("_vs_")}
    f32 = load(args, "float32")
    b16 = load(args, "bfloat16") if names & {"bf16", "fp8"} else None
    voice = f32.voices[0] if f32.voices else None
    reqs = [SynthesisRequest(text=t, voice=voice, language="english",
                             sampling=SamplingParams.greedy(max_new_tokens=args.frames + 1,
                                                            min_new_tokens=args.frames + 1, seed=i))
            for i, t in enumerate(TEXTS[:args.requests])]
    kinds = {"fp32": (f32, False), "bf16": (b16, False), "fp8": (b16, True)}
    for fmt in PACKED:
        if fmt in names:
            kinds[fmt] = (packed_engine(args, fmt), False)
    res = {"model": args.model or f"dummy-{args.dummy}", "device": args.device, "frames": args.frames}
    for name in args.pairs.split(","):
        test, ref = name.split("_vs_")
        run = {"runner_eng": f32, "linear": test} if test in PACKED else {}
        res[name] = pair(*kinds[ref], *kinds[test], reqs, free=args.free_running, **run)
        log.info("%s: %s", name, res[name])
    if "bf16_vs_fp32" in res and "fp8_vs_bf16" in res:  # the adoption rule of the fp8 cache
        res["fp8_as_good_as_bf16"] = all(res["fp8_vs_bf16"][k] >= res["bf16_vs_fp32"][k] for k in (
            "teacher_forced_codebook0", "teacher_forced_all"))
    for fmt in PACKED:  # the adoption rule of packed weights (runtime.linear auto)
        if "bf16_vs_fp32" in res and f"{fmt}_vs_fp32" in res:
            res[f"{fmt}_as_good_as_bf16"] = all(res[f"{fmt}_vs_fp32"][k] >= res["bf16_vs_fp32"][k] for k in (
                "teacher_forced_codebook0", "teacher_forced_all"))
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        open(args.json, "w").write(text)
    print("| pair | teacher-forced code 0 | codes 1-15 | all | identical requests | mean prefix |\n|---|---|---|---|---|---|")
    for name in args.pairs.split(","):
        r = res[name]
        free = (f"{r['free_running_identical_requests']}/{r['free_running_requests']} | "
                f"{r['free_running_mean_prefix']:.2f}" if "free_running_requests" in r else "- | -")
        print(f"| {name} | {r['teacher_forced_codebook0']:.3f} | {r['teacher_forced_codebooks1_15']:.3f} | "
              f"{r['teacher_forced_all']:.3f} | {free} |")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main()
