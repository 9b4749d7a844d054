"""Names the engine accepts, in a module without heavy imports (the command line and the config
offer them as choices without loading torch).

The tables themselves: dtypes in engines.model.checkpoint.DTYPES, codec backends in
engines.codec.backend / engines.codec.build; those modules take their names from here.
"""
from __future__ import annotations

import re

AUTO = "auto"
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # long name -> engine-build name
DTYPE_NAMES = tuple(DTYPE_SHORT)
CODEC_BACKENDS = ("torch", "torch-compiled", "onnxruntime", "tensorrt")  # what build-engines can build
RUNTIME_CODECS = ("torch", "torch-compiled", "built", AUTO)  # what the runner's runtime.codec takes
KV_CACHES = (AUTO, "model", "fp8")  # runtime.kv_cache: the talker's key/value cache (auto: the model's dtype)
CODEC_DTYPES = (AUTO, "model", "bfloat16")  # runtime.codec_dtype: the codec lanes' dtype (auto: bf16 on a CPU with bf16 dots)
LINEARS = (AUTO, "model", "fp16", "int8")  # runtime.linear: the decoder layers' weights (fp16, int8: CPU only; int8 lossy)

ALL = "all"
DEVICE_ITEM = re.compile(r"^(auto|cpu|cuda(:\d+)?|npu(:\d+)?)$")  # one item of model.device


def is_multi(device: str | None) -> bool:
    """Whether a model.device value names several engines ('all' or a comma list)."""
    return bool(device) and (str(device).strip() == ALL or "," in str(device))


def check_device_spec(device: str) -> str | None:
    """Why a model.device value is not valid (None when it is): auto, all, cpu, cuda[:N], npu[:N], or a
    comma list of cpu / cuda[:N] / npu[:N]."""
    items = [x.strip() for x in str(device).split(",")]
    if items == [ALL] or (len(items) == 1 and DEVICE_ITEM.match(items[0])):
        return None
    bad = [x for x in items if not DEVICE_ITEM.match(x) or x == "auto"]
    if len(items) > 1 and not bad:
        return None
    return (f"{device!r}: give auto, all, cpu, cuda[:N], npu[:N], or a comma list such as cuda:0,cuda:1"
            + (f" ({', '.join(map(repr, bad))} not allowed in a list)" if len(items) > 1 else ""))


def own_gpu(device: str, env) -> tuple[str, str] | None:
    """How an engine process on the CUDA GPU `device` ('cuda:N') sees that GPU alone: (the device inside the
    process, 'cuda:0'; the CUDA_VISIBLE_DEVICES value naming it, taken from `env`'s own list when it has one).
    Inductor's on-disk graph cache keys its entries by the device index, so an engine on cuda:1 compiled again
    everything the engine on cuda:0 had cached; seen as cuda:0, every GPU's engine loads what the first
    compiled. None: nothing to change (a device without an index, not CUDA, or an index `env`'s list lacks:
    the process then reports the device as missing)."""
    kind, _, index = str(device).strip().partition(":")
    if kind != "cuda" or not index.isdigit():
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return "cuda:0", index
    items = [x.strip() for x in visible.split(",")]
    i = int(index)
    if i >= len(items) or not items[i] or items[i].startswith("-"):
        return None
    return "cuda:0", items[i]
