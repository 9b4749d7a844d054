"""What a speech request asks for: the fields of `POST /v1/audio/speech` (OpenAI's, our extras, and those
vllm-omni documents for Qwen3-TTS), read once here for every route that takes them: the speech route, and
vllm-omni's WebSocket (`session.config` carries the same fields; appliance.ws_vllm).

vllm-omni's fields, with their meaning here:
    task_type            CustomVoice | VoiceDesign | Base: must name the loaded checkpoint's kind (400 otherwise,
                         as vllm-omni answers a mismatch); absent: the checkpoint's kind
    speaker              another name for `voice`
    max_new_tokens       a cap on the audio frames (12.5 a second), as `max_frames`; both given: the smaller
    non_streaming_mode   the prompt's text mode: false feeds the text token by token beside the audio (the
                         model's streaming-text mode), true puts it all in the prompt; absent: the model's default
    x_vector_only_mode   true: clone from the reference's speaker embedding alone (its transcript unused)
    initial_codec_chunk_frames   accepted (an integer >= 0); without effect: the first audio chunk here is
                         always one frame, the smallest there is
    sample_rate          the model's own rate (24000) or absent; another rate: 400 (no resampling here)
    ref_audio            appliance.http_refaudio (base64, a data URL, a file in the voices folder; no URLs)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from audio.encode_stream import CONTENT_TYPES
from audio.speed import check_speed
from text.lexicons import file_lexicon, lexicon_entries, merged
from text.normalize.lexicon import LexiconError

from appliance.http_common import ApiError, field
from appliance.languages import model_language

STREAM_FORMATS = ("audio", "sse")
TASK_TYPES = {"CustomVoice": "custom_voice", "VoiceDesign": "voice_design", "Base": "base"}  # vllm-omni's names


@dataclass
class SpeechOptions:
    """Everything of a speech body but its text and reference audio, checked."""

    fmt: str = "mp3"
    stream: bool = False  # chunked as made (else one complete file)
    sse: bool = False  # Server-Sent Events
    speed: float = 1.0
    voice: Optional[str] = None
    language: str = "auto"
    instruct: Optional[str] = None
    ref_text: Optional[str] = None
    seed: Optional[int] = None
    max_frames: Optional[int] = None  # over the whole answer
    non_streaming: Optional[bool] = None
    lexicon: object = None  # text.normalize.lexicon's rules, or None


def options(ctx, data: dict) -> SpeechOptions:
    """The options of the speech body `data` (400 naming a field that is wrong and what it takes)."""
    engine = ctx.host.engine
    fmt = (field(data, "response_format", str) or ctx.cfg.http.response_format).lower()  # null: the default
    if fmt not in CONTENT_TYPES:
        raise ApiError(400, f"unknown response_format {fmt!r}; choose one of {', '.join(CONTENT_TYPES)}")
    stream_format = field(data, "stream_format", str) or "audio"
    if stream_format not in STREAM_FORMATS:
        raise ApiError(400, f"unknown stream_format {stream_format!r}; choose audio (the encoded audio itself) or "
                            "sse (Server-Sent Events with base64 audio)")
    sse = stream_format == "sse"
    try:
        speed = check_speed(field(data, "speed", (int, float)))
    except ValueError as exc:
        raise ApiError(400, f"'speed': {exc}") from None
    try:
        lexicon = merged(file_lexicon(ctx.cfg.jobs.lexicon), lexicon_entries(data.get("lexicon"), "request"))
    except LexiconError as exc:
        raise ApiError(400, str(exc)) from None
    _check_task(data, engine.model_type)
    rate = field(data, "sample_rate", int)
    if rate is not None and rate != engine.sample_rate:
        raise ApiError(400, f"'sample_rate': this server speaks at {engine.sample_rate} Hz only; leave it out (or "
                            f"send {engine.sample_rate}) and resample in the client")
    chunk = field(data, "initial_codec_chunk_frames", int)
    if chunk is not None and chunk < 0:
        raise ApiError(400, "'initial_codec_chunk_frames' must be 0 or more")
    caps = [v for v in (field(data, "max_frames", int), field(data, "max_new_tokens", int)) if v is not None]
    if any(v < 1 for v in caps):
        raise ApiError(400, "'max_frames' and 'max_new_tokens' must be at least 1 (frames of 80 ms)")
    ref_text = field(data, "ref_text", str)
    if field(data, "x_vector_only_mode", bool):
        ref_text = None  # the speaker embedding alone
    return SpeechOptions(fmt=fmt, stream=sse or field(data, "stream", bool) is True, sse=sse, speed=speed,
                         voice=_voice(data), language=model_language(field(data, "language", str), engine.languages),
                         instruct=field(data, "instructions", str), ref_text=ref_text, seed=field(data, "seed", int),
                         max_frames=min(caps) if caps else None,
                         non_streaming=field(data, "non_streaming_mode", bool), lexicon=lexicon)


def spoken_text(ctx, data: dict, opts: SpeechOptions, name: str = "input") -> str:
    """The body's text, checked against http.max_text_chars, through the lexicon."""
    text = field(data, name, str, required=True)
    if not text.strip():
        raise ApiError(400, f"'{name}' is empty: give some text to speak")
    if len(text) > ctx.cfg.http.max_text_chars:
        raise ApiError(413, f"'{name}' has {len(text)} characters; the limit is {ctx.cfg.http.max_text_chars} "
                            "(submit long texts as a job: POST /v1/jobs)", "too_large")
    return opts.lexicon.apply(text) if opts.lexicon else text


def synthesis_request(ctx, opts: SpeechOptions, text: str, ref_audio: Optional[str] = None):
    """The engine request speaking `text` with `opts` (400 when a Base checkpoint has no voice to clone)."""
    req = ctx.host.request(text, voice=opts.voice, language=opts.language, instruct=opts.instruct,
                           ref_audio=ref_audio, ref_text=opts.ref_text, seed=opts.seed, max_frames=opts.max_frames,
                           non_streaming_text=opts.non_streaming)
    if req is None:
        raise ApiError(400, "this Base checkpoint clones voices: give 'ref_audio' (base64 or a data URL) or a saved "
                            "voice (POST /v1/voices adds one)")
    return req


def _voice(data: dict) -> Optional[str]:
    voice = data.get("voice", data.get("speaker"))  # `speaker`: vllm-omni's other name for it
    if isinstance(voice, dict):  # the OpenAI SDK's custom voice reference {"id": ...}
        voice = voice.get("id")
    if voice is not None and not isinstance(voice, str):
        raise ApiError(400, """'voice' must be a voice name or {"id": name} (GET /v1/audio/voices lists them)""")
    return voice


def _check_task(data: dict, model_type: str) -> None:
    task = field(data, "task_type", str)
    if task is None:
        return
    kind = {k.lower(): v for k, v in TASK_TYPES.items()}.get(task.lower())
    if kind is None:
        raise ApiError(400, f"unknown task_type {task!r}; choose one of {', '.join(TASK_TYPES)}")
    if kind != model_type:
        ours = next(k for k, v in TASK_TYPES.items() if v == model_type)
        raise ApiError(400, f"this is a {ours} checkpoint: it does not do task_type {task!r}; send task_type "
                            f"{ours!r} or leave it out (a {task} checkpoint does the other)")
