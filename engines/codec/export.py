"""ONNX export of the codec decoder: the streaming step (state in, state out) and the one-shot decode.

The streaming step graph is one call of `StreamingCodecDecoder.push` made functional: every
left-context buffer of the stream state is an explicit input and the updated buffer an explicit
output, so any runtime (ONNX Runtime, TensorRT) can run chunk after chunk by feeding the outputs of
one call back as the inputs of the next.

    inputs   codes    [B, K, n]   int64   K = num_quantizers (16), n frames this step
             n_valid  [B]         int64   real frames per row this step (0 = idle row, <= n)
             pos      [B]         int64   frames each row has decoded so far (rotary positions)
             state.<name>  [B, ...] float one per stateful layer (see `state_specs`)
    outputs  wav      [B, 1, n * samples_per_frame]  float, row b valid up to n_valid[b] * spf
             pos_out  [B]         int64   pos + n_valid
             new_state.<name>  [B, ...] float, same shapes as the inputs

Batch B and frames n are dynamic axes. The one-shot graph is `codes [B, K, T] -> wav [B, 1, T*spf]`.
Export uses torch's TorchScript-based ONNX exporter (`dynamo=False`), which needs only the `onnx`
package; the graph is traced from the very layers the torch path runs (no second implementation).
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from engines.codec.decoder import CodecDecoder
from engines.codec.state import StreamState
from engines.model.config import CodecDecoderConfig

log = logging.getLogger(__name__)

OPSET = 17
STATE_IN, STATE_OUT = "state.", "new_state."
STEP_INPUTS = ("codes", "n_valid", "pos")
STEP_OUTPUTS = ("wav", "pos_out")


def state_specs(cfg_or_decoder: CodecDecoderConfig | CodecDecoder, batch: int = 1) -> dict[str, tuple]:
    """{state buffer name: shape for `batch` rows}, in graph input order (computed without weights)."""
    dec = cfg_or_decoder
    if not isinstance(dec, CodecDecoder):
        with torch.device("meta"):
            dec = CodecDecoder(cfg_or_decoder)
    return dict(dec.stream_state_shapes(batch))


def step_input_names(cfg_or_decoder) -> list[str]:
    return [*STEP_INPUTS, *(STATE_IN + k for k in state_specs(cfg_or_decoder))]


def step_output_names(cfg_or_decoder) -> list[str]:
    return [*STEP_OUTPUTS, *(STATE_OUT + k for k in state_specs(cfg_or_decoder))]


class CodecStep(nn.Module):
    """Functional streaming step: (codes, n_valid, pos, *states) -> (wav, pos_out, *new_states).

    It runs the decoder's own streaming code on copies of the incoming state buffers, which the
    layers update in place; the copies are returned as the new state.
    """

    def __init__(self, decoder: CodecDecoder):
        super().__init__()
        self.decoder = decoder
        self.keys = list(decoder.stream_state_shapes(1))

    def forward(self, codes: Tensor, n_valid: Tensor, pos: Tensor, *states: Tensor):
        bufs = {k: s.clone() for k, s in zip(self.keys, states)}
        st = StreamState(bufs, pos, n_valid=n_valid)
        wav = self.decoder(codes, st)  # [B, 1, n * spf]
        return (wav, pos + n_valid, *(bufs[k] for k in self.keys))


class CodecOneShot(nn.Module):
    """codes [B, K, T] -> wav [B, 1, T * spf] with full left context (no state)."""

    def __init__(self, decoder: CodecDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, codes: Tensor) -> Tensor:
        return self.decoder(codes)


def example_step_inputs(decoder: CodecDecoder, batch: int = 2, frames: int = 3) -> tuple[Tensor, ...]:
    """Zero-state inputs for one step of `frames` frames on `batch` rows (CPU)."""
    p = next(decoder.parameters())
    k = decoder.config.num_quantizers
    codes = torch.randint(0, decoder.config.codebook_size, (batch, k, frames), device=p.device)
    n_valid = torch.full((batch,), frames, dtype=torch.long, device=p.device)
    pos = torch.zeros(batch, dtype=torch.long, device=p.device)
    states = [torch.zeros(s, dtype=p.dtype, device=p.device) for s in state_specs(decoder, batch).values()]
    return (codes, n_valid, pos, *states)


def _export(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            axes: dict, out_shapes: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated in favour of dynamo/onnxscript
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False, do_constant_folding=True)
    _tidy_graph(path, out_shapes or {})
    log.info("exported %s (%.1f MB)", path, path.stat().st_size / 1e6)
    return path


def _tidy_graph(path: Path, out_shapes: dict) -> None:
    """Fix up the exported file in place.

    - Negative Transpose perms (the TorchScript exporter emits them for `movedim(-1, d)`) become the
      positive ones ONNX requires; ONNX Runtime rejects the graph otherwise.
    - Outputs named in `out_shapes` ({name: shape with "batch" first}) get their static dims
      declared; shape inference cannot see through the per-row gather that produces them.
    """
    import onnx

    model, changed = onnx.load(str(path)), 0
    for out in model.graph.output:
        if out.name in out_shapes:
            dims = out.type.tensor_type.shape.dim
            for d, v in zip(dims, out_shapes[out.name]):
                d.Clear()
                if isinstance(v, str):
                    d.dim_param = v
                else:
                    d.dim_value = v
            changed += 1
    for node in model.graph.node:
        if node.op_type != "Transpose":
            continue
        for attr in node.attribute:
            if attr.name == "perm" and any(p < 0 for p in attr.ints):
                fixed = [p % len(attr.ints) for p in attr.ints]
                del attr.ints[:]
                attr.ints.extend(fixed)
                changed += 1
    if changed:
        onnx.save(model, str(path))
        log.debug("%s: %d Transpose perms / output shapes fixed", path, changed)


def _check_exportable(decoder: CodecDecoder) -> None:
    p = next(decoder.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise ValueError(f"ONNX export needs an fp32 CPU decoder, got {p.dtype} on {p.device}: load one with "
                         "load_codec_decoder(speech_tokenizer_dir, 'cpu', torch.float32)")
    try:
        import onnx  # noqa: F401  (the exporter imports it; fail early with a clear message)
    except ImportError as exc:
        raise RuntimeError("ONNX export needs the 'onnx' package: pip install 'tts-appliance[onnx]'") from exc


def export_step(decoder: CodecDecoder, path: str | Path) -> Path:
    """Export the streaming step of an fp32 CPU decoder to `path` (dynamic batch and frames)."""
    _check_exportable(decoder)
    step = CodecStep(decoder).eval()
    ins, outs = step_input_names(decoder), step_output_names(decoder)
    axes = {"codes": {0: "batch", 2: "frames"}, "wav": {0: "batch", 2: "samples"}}
    axes.update({n: {0: "batch"} for n in ins[1:] + outs[1:]})
    shapes = {STATE_OUT + k: ("batch", *s[1:]) for k, s in state_specs(decoder).items()}
    shapes["pos_out"] = ("batch",)
    return _export(step, example_step_inputs(decoder), Path(path), ins, outs, axes, shapes)


def export_one_shot(decoder: CodecDecoder, path: str | Path) -> Path:
    """Export the one-shot decode of an fp32 CPU decoder to `path` (dynamic batch and frames)."""
    _check_exportable(decoder)
    codes = example_step_inputs(decoder, 2, 5)[0]
    axes = {"codes": {0: "batch", 2: "frames"}, "wav": {0: "batch", 2: "samples"}}
    return _export(CodecOneShot(decoder).eval(), (codes,), Path(path), ["codes"], ["wav"], axes)
