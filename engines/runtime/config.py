"""EngineConfig: how one engine runs its slots (the runner's settings; the model's are in ModelConfig)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 64
    max_queue: int = 256
    stream_reserve: int = -1  # slots batch work leaves free while streams are about (-1: a quarter of the slots)
    batch_admit_streams: int = 2  # batch requests admitted per loop iteration while streams are about
    prefill_rows_streams: int = 2  # rows of the prefill group batch work leaves free while streams are about
    max_context: int = 2048  # talker cache length per slot (prompt + frames)
    max_positions: int = 0  # positions admitted requests may reserve at once, each its prompt + frame limit (0: no limit)
    max_text_rows: int = 1024  # streaming-text rows per request
    prefill_chunk: int = 256  # prompt tokens per request per loop iteration (keeps streams flowing)
    prefill_batch: int = 8  # requests prefilled together (side-cache rows)
    length_step: int = 256  # cache-length bucket granularity
    batch_buckets: tuple = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    use_graphs: Optional[bool] = None  # None: on CUDA
    prefill_graphs: bool = True  # with graphs: prompt chunks prefilled by captured graphs (per rows/length bucket)
    # read a step's codes back while the next step runs (pinned buffers + events)
    overlap: bool = True
    compile: Optional[bool] = None  # compile the step's regions with torch.compile; None: on CUDA
    gemv: bool = True  # compiled path: one-row matmuls as fused reductions (batch-1 bucket)
    attn_kernel: Optional[bool] = None  # decode attention as one Triton kernel (None: NVIDIA GPUs from Ampere on)
    sample_kernel: Optional[bool] = None  # the step's draws as one Triton kernel each, no sort (None: as attn_kernel)
    row_kernel: bool = False  # one-row projections as Triton kernels, norms and residuals fused (A/B: off)
    layer_kernel: Optional[bool] = None  # one-row layers as one persistent kernel each, fuse="layer" (None: as attn_kernel)
    # the decoder layers' weights: model (the model's dtype), fp16 or int8 (CPU; engines.runtime.linears), or auto
    # (fp16 for fp32 weights on a CPU that runs it); the loader passes what engines.load.settings decided
    linear: str = "model"
    codec_dtype: str = "model"  # the codec lanes' dtype: model or bfloat16 (engines.codec.dtype; the loader decides auto)
    kv_cache: str = "auto"  # the talker's key/value cache: auto / model (the model's dtype) or fp8 (a scale per vector)
    attn_split: Optional[bool] = None  # the talker's decode attention split over programs per row (None: AUTO_SPLIT)
    fuse: str = "layer"  # compiled regions: "layer" (one per decoder layer) or "pass" (per predictor step / talker step)
    topk_cap: int = 64  # steps whose every row samples with 0 < top-k <= this sort only that many ids (0: never)
    topk_min_batch: int = 16  # ... from this batch bucket up (measured: below it the full sort is faster)
    first_chunk_frames: int = 1  # streams: frames in the first codec chunk (then doubling up to max_chunk_frames)
    max_chunk_frames: int = 16
    batch_chunk_frames: int = 64  # batch work: frames per codec chunk (at most batch_call_frames / rows)
    batch_call_frames: int = 1024  # rows x frames of one codec call (bounds its memory: 4096 at 256 slots ran out)
    batch_call_frames_streams: int = 512  # ... while streams are about (a long call delays their decode steps)
    # batch work with more rows than calls of batch_window_frames frames a row may carry: a call decodes a window
    # of the rows for up to that many frames instead of all rows for fewer (engines.runtime.codec_lane; None: on
    # a GPU or NPU, off on the CPU)
    codec_windows: Optional[bool] = None
    batch_window_frames: int = 16
    cpu_call_frames: int = 64  # on the CPU at most this (a call's activations out of cache cost more than its size)
    cpu_codec_threads: int = 0  # CPU: > 0 runs each lane's codec off the loop thread, a call's rows split over this many threads
    cpu_idle_threads: int = 0  # CPU: the loop's torch threads while no codec call runs (0: its own count always)
    codec_streams: bool = True  # codec lanes on their own device streams, overlapping the decode steps
    codec_backend: str = "torch"  # torch | torch-compiled | built | auto (engines.codec.build.runtime_codec)
    codec_fast: Optional[bool] = None  # torch codec: channels-last fused upsampling stack (None: on CUDA)
    engine_cache: Optional[str] = None  # build-engines cache folder of the model (None: default_cache_dir)
