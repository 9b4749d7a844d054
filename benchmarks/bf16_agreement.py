"""bf16 quality guard: how often bf16 picks the same codes as fp32 on the same weights and inputs.

    python -m benchmarks.bf16_agreement --model tests/data/tiny/cv_small --device cpu
    python -m benchmarks.bf16_agreement --dummy 0.6b --device cuda

Two measures, both greedy:
- teacher-forced: the fp32 codes are fed back to both models, and at every frame and codebook we compare
  the argmax each model would pick (independent of earlier disagreements: the per-decision agreement);
- free-running: the bf16 batched runtime (CUDA graphs on a GPU) generates on its own; we report the
  share of requests identical to fp32 and the mean fraction of frames before the first difference.
Random weights make many logits near-ties, so these rates are a lower bound for a trained checkpoint.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from engines.api import SamplingParams, SynthesisRequest

TEXTS = ["Hello world, this is a test of the speech engine.", "The river shone like a ribbon of glass.",
         "Numbers such as twelve and forty-two are spoken in full.", "Nobody remembered who planted the trees."]


@torch.no_grad()
def teacher_forced_picks(eng, req: SynthesisRequest, codes: torch.Tensor) -> torch.Tensor:
    """Greedy picks `[F, 16]` of `eng` when the reference `codes` `[F, 16]` are the history."""
    talker, dev = eng.talker, eng.device
    spec, _ = eng.resolve(req)
    prompt = eng.prompts.build(spec)
    t = prompt.prefill.shape[0]
    cache = talker.new_cache(1, t + codes.shape[0] + 1, dev, prompt.prefill.dtype)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--dummy", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    f32, b16 = load(args, "float32"), load(args, "bfloat16")
    voice = f32.voices[0] if f32.voices else None
    reqs = [SynthesisRequest(text=t, voice=voice, language="english",
                             sampling=SamplingParams.greedy(max_new_tokens=args.frames + 1,
                                                            min_new_tokens=args.frames + 1, seed=i))
            for i, t in enumerate(TEXTS)]
    ref = [g.codes for g, _ in f32.generate_codes(reqs)]
    tf = []
    for req, codes in zip(reqs, ref):
        a, b = teacher_forced_picks(f32, req, codes), teacher_forced_picks(b16, req, codes)
        tf.append((a == b).float())
    tf = torch.cat(tf)  # [frames, 16]
    from engines.runtime.runner import EngineRunner

    free = [r.codes for r in EngineRunner(b16, max_slots=len(reqs), max_context=512).synthesize(reqs)]
    same_prefix = []
    for r, c in zip(ref, free):
        r = r.numpy()
        n = min(len(r), len(c))
        diff = np.nonzero((r[:n] != c[:n]).any(1))[0]
        same_prefix.append((diff[0] if len(diff) else n) / max(len(r), 1))
    res = {"model": args.model or f"dummy-{args.dummy}", "device": args.device, "frames": args.frames,
           "teacher_forced_codebook0": float(tf[:, 0].mean()), "teacher_forced_codebooks1_15": float(tf[:, 1:].mean()),
           "teacher_forced_all": float(tf.mean()),
           "free_running_identical_requests": sum(int(np.array_equal(r.numpy(), c)) for r, c in zip(ref, free)),
           "free_running_requests": len(reqs), "free_running_mean_prefix": float(np.mean(same_prefix))}
    print(json.dumps(res, indent=1))
    if args.json:
        open(args.json, "w").write(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
