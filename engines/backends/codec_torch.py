"""Torch codec backend: `StreamingCodecDecoder` behind the common backend interface.

This is the reference and the fallback everywhere (CPU, CUDA, Ascend NPU). CUDA-graph /
torch.compile variants of it are chosen by the decode loop, not here.
"""
from __future__ import annotations

from torch import Tensor

from engines.model.codec_decoder import CodecDecoder
from engines.runtime.streaming_codec import StreamingCodecDecoder

from .base import check_push


class TorchCodec:
    """Streaming codec on the decoder's own device and dtype (see engines.backends.base)."""

    name = "torch"

    def __init__(self, decoder: CodecDecoder, batch_size: int = 1):
        self.decoder = decoder
        self.stream = StreamingCodecDecoder(decoder, batch_size)
        self.batch_size, self.device = batch_size, self.stream.device
        self.samples_per_frame = self.stream.samples_per_frame

    @property
    def frames_decoded(self) -> Tensor:
        return self.stream.frames_decoded

    def push(self, codes: Tensor, n_valid: Tensor | None = None) -> Tensor:
        """codes [B, K, n] -> wav [B, 1, n * samples_per_frame] (decoder dtype, decoder device)."""
        check_push(codes, self.batch_size, self.decoder.config.num_quantizers)
        return self.stream.push(codes, n_valid)

    def reset(self, rows: Tensor | None = None) -> None:
        self.stream.reset(rows)

    def flush(self, rows: Tensor | None = None) -> Tensor:
        return self.stream.flush(rows)

    def __repr__(self) -> str:
        return f"TorchCodec(batch={self.batch_size}, device={self.device}, dtype={self.stream.dtype})"
