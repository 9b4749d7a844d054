"""TensorRT codec: build a plan from the streaming-step ONNX graph, and run it with torch buffers.

NOT YET RUN ON HARDWARE: TensorRT could not be installed where this was written. The code follows
the TensorRT 10 Python API (Builder / OnnxParser / IBuilderConfig / IOptimizationProfile at build
time; Runtime / ICudaEngine / IExecutionContext with set_input_shape, set_tensor_address and
execute_async_v3 at run time). The shape logic (`profile_shapes`, `pick_bucket`) is tested on CPU.

Profiles: one per chunk size c in `chunk_frames`, each with frames fixed at c and batch from 1 to
`max_batch` (opt = max_batch), so TensorRT tunes kernels for exactly the shapes the decode loop
pushes. At run time a push of n frames goes to the smallest bucket c >= n: codes are zero-padded to
c and `n_valid` keeps the padding out of the state (the graph's per-row valid counts do that), so
the output equals an exact n-frame step. Longer pushes are split into bucket-sized pieces.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch import Tensor

from engines.model.config import CodecDecoderConfig

from engines.codec.backend import check_move, check_push, row_mask
from engines.codec.export import STATE_IN, STATE_OUT, state_specs

log = logging.getLogger(__name__)
PRECISIONS = ("fp32", "fp16", "bf16")


def import_tensorrt():
    """The tensorrt module, or None when it is not installed (or fails to load)."""
    try:
        import tensorrt
    except Exception as exc:  # ImportError, or a libnvinfer load error
        log.debug("tensorrt not usable: %s", exc)
        return None
    return tensorrt


def profile_shapes(cfg: CodecDecoderConfig, max_batch: int, chunk_frames) -> list[dict[str, tuple]]:
    """One optimisation profile per chunk size: {input name: (min, opt, max) shape}."""
    if max_batch < 1 or not chunk_frames or min(chunk_frames) < 1:
        raise ValueError(f"need max_batch >= 1 and chunk sizes >= 1, got {max_batch}, {chunk_frames}")
    k = cfg.num_quantizers
    states = state_specs(cfg, 1)
    profiles = []
    for c in sorted(set(int(c) for c in chunk_frames)):
        prof = {"codes": ((1, k, c), (max_batch, k, c), (max_batch, k, c)),
                "n_valid": ((1,), (max_batch,), (max_batch,)),
                "pos": ((1,), (max_batch,), (max_batch,))}
        for name, shape in states.items():
            rest = tuple(shape[1:])
            prof[STATE_IN + name] = ((1, *rest), (max_batch, *rest), (max_batch, *rest))
        profiles.append(prof)
    return profiles


def pick_bucket(n: int, buckets) -> int:
    """Smallest bucket >= n (n <= max(buckets)); callers split longer pushes first."""
    fits = [b for b in sorted(buckets) if b >= n]
    if not fits:
        raise ValueError(f"{n} frames exceed the largest chunk bucket {max(buckets)}: split the push")
    return fits[0]


def build_plan(onnx_path: str | Path, plan_path: str | Path, cfg: CodecDecoderConfig, max_batch: int,
               chunk_frames, precision: str = "fp16", workspace_gib: float = 4.0) -> dict:
    """Parse the step ONNX, build and serialize a TensorRT plan; returns what the manifest records."""
    trt = import_tensorrt()
    if trt is None:
        raise RuntimeError("TensorRT is not installed (import tensorrt failed): install the 'tensorrt' "
                           "wheel matching your CUDA driver, or use the onnxruntime / torch codec")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    t0 = time.time()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    profiles = profile_shapes(cfg, max_batch, chunk_frames)
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"TensorRT failed to build a plan from {onnx_path} (see the TensorRT log above)")
    Path(plan_path).write_bytes(bytes(plan))
    secs = time.time() - t0
    log.info("built TensorRT plan %s (%s, %d profiles) in %.0f s", plan_path, precision, len(profiles), secs)
    return {"precision": precision, "max_batch": max_batch, "chunk_frames": sorted(set(chunk_frames)),
            "profiles": [{k: [list(s) for s in v] for k, v in p.items() if k == "codes"} for p in profiles],
            "build_seconds": round(secs, 1), "tensorrt": trt.__version__}


class TrtCodec:
    """Streaming codec running a TensorRT plan on the current CUDA stream, with torch buffers.

    The state lives in torch tensors; a step of the first b rows reads them and writes a scratch
    set (TensorRT outputs must not alias its inputs), whose b rows are then copied back, so rows
    b.. keep their streams. Outputs are fresh torch tensors on `device`.
    """

    name = "tensorrt"
    graphable = False  # enqueue inside a CUDA graph capture has not been tried on hardware

    def __init__(self, plan_path: str | Path, batch_size: int = 1, samples_per_frame: int = 1920,
                 device: str | torch.device = "cuda"):
        trt = import_tensorrt()
        if trt is None:
            raise RuntimeError("TensorRT is not installed: cannot run a .plan codec engine")
        self.trt, self.path = trt, Path(plan_path)
        self.batch_size, self.samples_per_frame = batch_size, samples_per_frame
        self.device = torch.device(device)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(self.path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{self.path} does not load with TensorRT {trt.__version__} on this GPU; "
                               "rebuild it with `tts-appliance build-engines --force`")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.state_names = [n[len(STATE_IN):] for n in self.inputs if n.startswith(STATE_IN)]
        self.num_quantizers = int(self.engine.get_tensor_shape("codes")[1])
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self.contexts = {}  # chunk bucket -> execution context bound to that bucket's profile
        for p in range(self.engine.num_optimization_profiles):
            frames = int(self.engine.get_tensor_profile_shape("codes", p)[2][2])  # max shape, frames axis
            ctx = self.engine.create_execution_context()
            ctx.set_optimization_profile_async(p, stream)
            self.contexts[frames] = ctx
        self.max_batch = int(self.engine.get_tensor_profile_shape("codes", 0)[2][0])
        if batch_size > self.max_batch:
            raise ValueError(f"{self.path} was built for at most {self.max_batch} streams, asked for "
                             f"{batch_size}; rebuild with a larger --max-batch")
        self.state, self.scratch = self._alloc_state(), self._alloc_state()

    def _torch_dtype(self, name: str) -> torch.dtype:
        dt = self.engine.get_tensor_dtype(name)
        table = {self.trt.DataType.FLOAT: torch.float32, self.trt.DataType.HALF: torch.float16,
                 self.trt.DataType.BF16: torch.bfloat16, self.trt.DataType.INT64: torch.int64,
                 self.trt.DataType.INT32: torch.int32, self.trt.DataType.BOOL: torch.bool}
        return table[dt]

    def _alloc_state(self) -> dict[str, Tensor]:
        bufs = {"pos": torch.zeros(self.batch_size, dtype=torch.int64, device=self.device)}
        for name in self.state_names:
            shape = (self.batch_size, *tuple(self.engine.get_tensor_shape(STATE_IN + name))[1:])
            bufs[name] = torch.zeros(shape, dtype=self._torch_dtype(STATE_IN + name), device=self.device)
        return bufs

    @property
    def frames_decoded(self) -> Tensor:
        return self.state["pos"]

    def push(self, codes: Tensor, n_valid: Tensor | None = None) -> Tensor:
        """codes [b, K, n] (the first b <= batch_size streams) -> wav [b, 1, n * spf] (float, on `device`)."""
        check_push(codes, self.batch_size, self.num_quantizers)
        b, n, top = codes.shape[0], codes.shape[-1], max(self.contexts)
        codes = codes.to(self.device, torch.int64)
        nv = torch.full((b,), n, dtype=torch.int64, device=self.device) if n_valid is None \
            else torch.as_tensor(n_valid).to(self.device, torch.int64)
        if n > top:  # split: each piece gets its share of every row's valid frames
            outs, done = [], 0
            while done < n:
                m = min(top, n - done)
                outs.append(self.push(codes[..., done:done + m], (nv - done).clamp(0, m)))
                done += m
            return torch.cat(outs, dim=-1)
        c = pick_bucket(n, self.contexts)
        if c > n:
            codes = torch.nn.functional.pad(codes, (0, c - n))
        wav = self._step(c, codes.contiguous(), nv.clamp(max=n).contiguous())
        return wav[..., :n * self.samples_per_frame]

    def _step(self, c: int, codes: Tensor, nv: Tensor) -> Tensor:
        b = codes.shape[0]
        ctx, src, dst = self.contexts[c], self.state, self.scratch  # leading rows of each: contiguous views
        wav = torch.empty(b, 1, c * self.samples_per_frame, dtype=self._torch_dtype("wav"), device=self.device)
        feeds = {"codes": codes, "n_valid": nv, "pos": src["pos"][:b],
                 **{STATE_IN + n: src[n][:b] for n in self.state_names}}
        for name, t in feeds.items():
            ctx.set_input_shape(name, tuple(t.shape))
            ctx.set_tensor_address(name, t.data_ptr())
        outs = {"wav": wav, "pos_out": dst["pos"][:b], **{STATE_OUT + n: dst[n][:b] for n in self.state_names}}
        for name, t in outs.items():
            ctx.set_tensor_address(name, t.data_ptr())
        if not ctx.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError(f"TensorRT execution of {self.path.name} failed (bucket {c}, batch {b})")
        for name, buf in src.items():
            buf[:b].copy_(dst[name][:b])
        return wav

    def reset(self, rows: Tensor | None = None) -> None:
        mask = row_mask(rows, self.batch_size).to(self.device)
        for buf in self.state.values():
            buf.masked_fill_(mask.view(-1, *([1] * (buf.dim() - 1))), 0)

    def flush(self, rows: Tensor | None = None) -> Tensor:
        self.reset(rows)
        return torch.zeros(self.batch_size, 1, 0, device=self.device)

    def move(self, src: int, dst: int) -> None:
        check_move(src, dst, self.batch_size)
        for buf in self.state.values():
            buf[dst].copy_(buf[src])
