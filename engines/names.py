"""Names the engine accepts, in a module without heavy imports (the command line and the config
offer them as choices without loading torch).

The tables themselves: dtypes in engines.model.checkpoint.DTYPES, codec backends in
engines.codec.backend / engines.codec.build; those modules take their names from here.
"""
from __future__ import annotations

AUTO = "auto"
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # long name -> engine-build name
DTYPE_NAMES = tuple(DTYPE_SHORT)
CODEC_BACKENDS = ("torch", "torch-compiled", "onnxruntime", "tensorrt")  # what build-engines can build
RUNTIME_CODECS = ("torch", "torch-compiled", "built", AUTO)  # what the runner's runtime.codec takes
