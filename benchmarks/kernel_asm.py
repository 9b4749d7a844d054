"""The decode-attention kernels compiled ahead of time for a GPU that is not here: what the compiler made of them.

    python -m benchmarks.kernel_asm                    # every variant, sm_90 (H100), a table
    python -m benchmarks.kernel_asm --keep out/asm     # also the PTX and the SASS of each, for reading

No GPU needed: each kernel of engines.runtime.attention is compiled by Triton for the target (`--arch 90`) with
the arguments the engine passes at the talker's shape (16 query heads, 8 key/value heads of 128, bf16, one new
token; the strides of a 2,048-position slot cache, as the JIT would specialize them: multiples of 16 and
16-byte aligned pointers), and its resources and instruction mix are counted: registers, spills, shared memory,
global loads by width, asynchronous copies (cp.async: the software pipeline), float8 conversions and the
tensor-core instructions. Reading what costs no device time answers most "why is it slow" questions first
(docs/PERFORMANCE.md uses it for the fp8 path).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engines.runtime import attention, attention_split

H, KV, D, S = 16, 8, 128, 2048  # the talker's heads; a slot cache of the shipped max_context


def _signature(fn, args: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of `fn` for ASTSource: args maps every parameter name to a pointer type
    string ('*bf16'), an int (i32, divisibility 16 where the value is a multiple of 16, as the JIT specializes),
    a float (fp32) or, for constexpr parameters, its value."""
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        v = args[name]
        if fn.params[i].is_constexpr:
            sig[name], consts[name] = "constexpr", v
        elif isinstance(v, str):
            sig[name] = v
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name}: {v!r}")
        elif isinstance(v, int):
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return sig, consts, attrs


def compile_for(fn, args: dict, arch: int, num_warps: int, num_stages: int):
    sig, consts, attrs = _signature(fn, args)
    src = ASTSource(fn, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps,
                                                                          "num_stages": num_stages})


def mix(ptx: str) -> dict:
    """Counts of the PTX instructions that say how the kernel reads and multiplies."""
    pats = {"ld.global v4": r"ld\.global(\.\w+)*\.v4", "ld.global v2": r"ld\.global(\.\w+)*\.v2\.",
            "ld.global scalar": r"ld\.global(\.nc)?(\.L\w+::\w+)?\.(b|u|f|s)(8|16|32|64)\s",
            "cp.async": r"cp\.async\.(ca|cg)", "cp.async.bulk": r"cp\.async\.bulk", "cvt fp8": r"cvt[.\w]*e4m3",
            "mma.sync": r"mma\.sync", "wgmma": r"wgmma\.mma_async", "bar.sync": r"bar\.sync|barrier\.sync",
            "ld.shared": r"ld\.shared", "ld.shared.b8": r"ld\.shared\.(b|u|s)8", "ldmatrix": r"ldmatrix",
            "st.shared": r"st\.shared"}
    return {k: len(re.findall(p, ptx)) for k, p in pats.items()}


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers, local-memory bytes a thread: spills) of a compiled kernel, read by Triton's own cuobjdump."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.cubin")
        Path(p).write_bytes(cubin)
        try:
            text = subprocess.run([str(tool), "-res-usage", p], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):  # no cuobjdump beside this Triton: unknown (-1)
            text = ""
    regs, local = re.search(r"REG:(\d+)", text), re.search(r"LOCAL:(\d+)", text)
    return int(regs.group(1)) if regs else -1, int(local.group(1)) if local else -1


def cases() -> dict:
    """name -> (kernel, args, num_warps, num_stages): the attention kernels the engine launches at book shape
    (the one-program kernel, the split kernel at one and four splits, the combine), each cache kind: bf16, fp8 as
    the engine lays it out (values with their positions contiguous) and fp8 with each value vector contiguous."""
    out = {}
    base = dict(qkv="*bf16", qn_w="*bf16", kn_w="*bf16", cos_tab="*fp32", sin_tab="*fp32", pos="*i64", out="*bf16",
                s_qb=(H + 2 * KV) * D, s_qt=(H + 2 * KV) * D, s_pb=1, s_ob=H * D, s_ot=H * D,
                eps=1e-6, scale=D ** -0.5, T=1, H=H, KV=KV, G=H // KV, D=D, M=16, INTERPRET=False)
    for kind in ("bf16", "fp8", "fp8-vec"):
        fp8, vt = kind != "bf16", kind == "fp8"
        cache = dict(kc="*fp8e4nv" if fp8 else "*bf16", vc="*fp8e4nv" if fp8 else "*bf16",
                     ks="*fp32" if fp8 else "*bf16", vs="*fp32" if fp8 else "*bf16",
                     s_kb=KV * S * D, s_kh=S * D, s_ks=D, s_vb=KV * S * D, s_vh=S * D,
                     s_vs=1 if vt else D, s_vd=S if vt else 1,
                     s_sb=KV * S if fp8 else 0, s_sh=S if fp8 else 0, FP8=fp8, VT=vt)
        launch = attention.launch_for(S)
        out[f"one program, {kind}"] = (attention._decode_attention_kernel,
                                       {**base, **cache, "BLOCK_S": launch["BLOCK_S"], "PREC": "tf32"},
                                       launch["num_warps"], launch.get("num_stages", 3))
        for splits in (1, 4):
            sl = attention_split.launch_for(S, fp8)
            out[f"split x{splits}, {kind}"] = (attention_split._split_attention_kernel,
                                              {**base, **cache, "part_o": "*fp32", "part_ml": "*fp32", "R": 2,
                                               "n_slots": S, "BLOCK_S": sl["BLOCK_S"], "PREC": "tf32",
                                               "SPLITS": splits}, sl["num_warps"], sl["num_stages"])
    out["combine x4"] = (attention_split._split_attention_combine,
                         dict(part_o="*fp32", part_ml="*fp32", out="*bf16", s_ob=H * D, s_ot=H * D, T=1, KV=KV,
                              G=H // KV, D=D, R=2, SPLITS=4, SP=4), 4, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--only", default="", help="names containing this text")
    ap.add_argument("--keep", help="a folder for each kernel's PTX and SASS")
    args = ap.parse_args()
    rows = []
    for name, (fn, kargs, warps, stages) in cases().items():
        if args.only not in name:
            continue
        k = compile_for(fn, kargs, args.arch, warps, stages)
        ptx = k.asm["ptx"]
        m = mix(ptx)
        regs, local = resources(k.asm["cubin"])
        rows.append((name, regs, local, k.metadata.shared, m))
        if args.keep:
            d = Path(args.keep)
            d.mkdir(parents=True, exist_ok=True)
            stem = re.sub(r"\W+", "_", name)
            (d / f"{stem}.ptx").write_text(ptx)
            (d / f"{stem}.ttgir").write_text(k.asm["ttgir"])
    keys = list(rows[0][4]) if rows else []
    print("| kernel | regs | local B | shared B | " + " | ".join(keys) + " |")
    print("|---" * (4 + len(keys)) + "|")
    for name, regs, spills, shared, m in rows:
        print(f"| {name} | {regs} | {spills} | {shared} | " + " | ".join(str(m[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
