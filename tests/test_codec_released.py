"""The codec decoder of the released shape (the published speech_tokenizer config: a 512-wide pre-transformer with
16 heads of 64, so q/k/v 1024 wide over a 512 hidden, intermediate 1024, latent 1024, decoder 1536; the
benchmarks' `RELEASED_CODEC`): it loads from an official-layout folder, streams frame by frame exactly as it
decodes in one pass (the reference path, its CPU matmul convolutions included), and decodes as the official
package does (oracle)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.dummy_checkpoint import write_codec
from benchmarks.dummy_engine import RELEASED_CODEC
from engines.codec.decoder import CodecDecoder, load_codec_decoder
from engines.codec.streaming import StreamingCodecDecoder
from engines.model.config import CodecConfig, CodecDecoderConfig
from tests.test_official_baseline import _oracle, needs_qwen_tts

PUBLISHED = {"attention_bias": False, "attention_dropout": 0.0, "latent_dim": 1024, "codebook_dim": 512,
             "codebook_size": 2048, "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512,
             "intermediate_size": 1024, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
             "head_dim": 64, "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16,
             "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000,
             "semantic_codebook_size": 4096, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
             "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512}  # its decoder_config
FRAMES = 14


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A speech_tokenizer folder of the released shape with random weights (seeded), as the benchmarks write it."""
    torch.manual_seed(11)
    dec = CodecDecoder(RELEASED_CODEC).eval()
    with torch.no_grad():
        for name, p in dec.named_parameters():
            if name.endswith("embedding_sum"):
                p.normal_(0, 1)  # (they initialise to constants)
    return write_codec(dec, CodecConfig(decoder=RELEASED_CODEC, encoder={}), tmp_path_factory.mktemp("codec") / "st")


@pytest.fixture(scope="module")
def codes():
    return torch.randint(0, 2048, (2, 16, FRAMES), generator=torch.Generator().manual_seed(12))


def test_the_benchmarks_codec_is_the_published_config():
    assert CodecDecoderConfig.from_dict(PUBLISHED) == RELEASED_CODEC


def test_released_codec_loads_from_its_folder(folder):
    cfg = json.loads((folder / "config.json").read_text())["decoder_config"]
    assert {k: cfg[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "intermediate_size")} == \
        {"hidden_size": 512, "num_attention_heads": 16, "head_dim": 64, "intermediate_size": 1024}
    dec = load_codec_decoder(folder, "cpu", torch.float32)
    attn = dec.pre_transformer.layers[0].self_attn
    assert attn.q_proj.weight.shape == (1024, 512) and attn.o_proj.weight.shape == (512, 1024)
    assert dec.config == RELEASED_CODEC


def test_released_codec_streams_as_it_decodes(folder, codes, one_thread):
    """Frames pushed in chunks of 1, 2, 4 and the rest (rows of different lengths) give the one-pass audio."""
    dec = load_codec_decoder(folder, "cpu", torch.float32)
    with torch.inference_mode():
        whole = dec(codes)[:, 0]  # [2, FRAMES * 1920]
        stream = StreamingCodecDecoder(dec, batch_size=2)
        parts, at = [], 0
        for n in (1, 2, 4, FRAMES - 7):
            valid = torch.tensor([n, n])
            parts.append(stream.push(codes[:, :, at:at + n], valid)[:, 0])
            at += n
    streamed = torch.cat(parts, dim=1)
    assert whole.abs().std() > 1e-2 and (whole.abs() < 0.99).float().mean() > 0.5  # not silent, not clipped
    err = float((streamed - whole).abs().max())
    assert err < 5e-5, err


@needs_qwen_tts
def test_released_codec_decodes_as_the_official_package(folder, codes, tmp_path):
    """The official Qwen3TTSTokenizer loads the same folder (its decoder strictly) and decodes the same codes."""
    np.save(tmp_path / "codes.npy", codes.numpy())
    script = f"""
import numpy as np, torch
from benchmarks.official_baseline import import_official
import_official()
from qwen_tts import Qwen3TTSTokenizer
torch.set_num_threads(1)
tok = Qwen3TTSTokenizer.from_pretrained({str(folder)!r})
dec = tok.model.decoder.float().eval()
codes = torch.from_numpy(np.load({str(tmp_path / "codes.npy")!r}))
with torch.inference_mode():
    np.save({str(tmp_path / "official.npy")!r}, dec(codes)[:, 0].float().numpy())
"""
    proc = _oracle(["-c", script])
    assert proc.returncode == 0, proc.stderr[-3000:]
    official = np.load(tmp_path / "official.npy")
    with torch.inference_mode():
        ours = load_codec_decoder(folder, "cpu", torch.float32)(codes)[:, 0].numpy()
    assert ours.shape == official.shape == (2, FRAMES * 1920)
    assert np.abs(official).std() > 1e-2
    err = float(np.abs(ours - official).max())
    assert err < 1e-4, err


@pytest.mark.parametrize("rows,frames", [(1, 1), (1, 5), (3, 2)])
def test_cpu_matmul_convolutions_equal_torchs(rows, frames, one_thread):
    """The CPU's weight-bound convolutions run as matmuls (engines.codec.layers.conv_matmul, transposed_matmul):
    the same output as torch's convolutions, streamed (left context carried) and in one pass."""
    from engines.codec import layers
    from engines.codec.state import StreamState

    torch.manual_seed(rows * 10 + frames)
    up = layers.CausalTransConv1d(768, 384, 16, 8)  # a transposed conv of kernel 2 x stride, >= 512 wide
    up.key = "up"
    conv = layers.CausalConv1d(768, 512, 7, dilation=3)
    conv.key = "conv"
    x = torch.randn(rows, 768, frames)
    with torch.inference_mode():
        assert layers.cpu_matmul(x) and 768 >= layers.MATMUL_TRANSPOSED_CHANNELS
        want_up = up.conv(x)[..., :frames * 8]
        want_conv = conv.conv(torch.nn.functional.pad(x, (18, 0)))
        assert torch.allclose(up(x), want_up, atol=1e-5) and torch.allclose(conv(x), want_conv, atol=1e-5)
        bufs = {"up": torch.randn(rows, 768, 1), "conv": torch.randn(rows, 768, 18)}
        st = StreamState({k: v.clone() for k, v in bufs.items()}, torch.zeros(rows, dtype=torch.long))
        got_up, got_conv = up(x, st), conv(x, st)
        assert torch.allclose(got_up, up.conv(torch.cat([bufs["up"], x], -1))[..., 8:8 + frames * 8], atol=1e-5)
        assert torch.allclose(got_conv, conv.conv(torch.cat([bufs["conv"], x], -1)), atol=1e-5)
