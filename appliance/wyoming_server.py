"""Wyoming protocol server (what Home Assistant speaks), on its own Unix socket or loopback port.

Events handled (JSON header line + optional payload, see the `wyoming` package):
    describe                 -> info (one TtsProgram "tts-appliance", a TtsVoice per voice, with the
                                checkpoint's languages as BCP-47 tags, e.g. en, de, zh, as Home Assistant
                                matches them; supports_synthesize_streaming=true)
    synthesize {text, voice} -> audio-start, audio-chunk... (16-bit mono PCM as made), audio-stop
                                voice: {name, language}: a tag (en, en-US, de-DE) or a language name,
                                else wyoming.default_language; no name: wyoming.default_voice
    synthesize-start {voice} -> begins a text stream; then
    synthesize-chunk {text}  -> text is buffered; each complete sentence is spoken at once
                                (sentences as text.split.split_streamed finds them)
                                (audio-start before the first audio, audio-chunk per chunk)
    synthesize-stop          -> the rest is spoken, then audio-stop and synthesize-stopped
Streaming clients also send a plain `synthesize` for servers that do not stream; it is ignored
while a text stream is open. A failure (unknown voice or language, busy engine, a protocol error, a bug)
is answered with an `error` event (text, code), and then the server closes the connection: no audio-stop
or synthesize-stopped follows. Clients wait for those or for the connection's end (Home Assistant's reads
until audio-stop, its streaming reader until synthesize-stopped, both until the connection ends; they
ignore `error`), so closing is what ends every client's wait, and it ends it as a failure rather than as
a short clip. The protocol carries no speaking speed. Text is spoken with the pronunciation lexicon of
jobs.lexicon. A connection that sends no event for wyoming.idle_timeout_s while nothing is being spoken (between
requests, or in a text stream waiting for its next chunk) gets an `error` event (code `timeout`) and is closed;
one whose client reads nothing of what is sent for wyoming.write_timeout_s (its buffers full) is closed at once,
its request cancelled (outcome `slow_client`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from engines.model.errors import EngineBusy, TTSError
from audio.encode import pcm16
from text.normalize.lexicon import LexiconError
from text.lexicons import file_lexicon
from text.normalize import language_code
from text.split import split_streamed

from appliance.languages import language_tags, model_language
from appliance.streams import ShuttingDown, serve_stream

log = logging.getLogger(__name__)
LINGER_S = 2.0  # after an error: how long the client's remaining input is read before the socket closes
ATTRIBUTION = Attribution(name="Qwen", url="https://github.com/QwenLM/Qwen3-TTS")


class ClientStalled(TimeoutError):
    """The client read nothing for wyoming.write_timeout_s: the connection was closed (what is buffered dropped)."""


class TtsHandler(AsyncEventHandler):
    """One Wyoming client connection."""

    def __init__(self, daemon, reader, writer):
        super().__init__(reader, writer)
        self.d = daemon
        self.stream_voice: Optional[str] = None
        self.stream_language = "auto"
        self.stream_text: Optional[str] = None  # None: no text stream open
        self.audio_started = False
        self.failed = False  # an error event was sent: the connection ends (see `disconnect`)

    async def run(self) -> None:
        """Serve events until the client closes, an event ends the connection, or none comes for
        wyoming.idle_timeout_s (events are served one at a time: the clock runs only while one is awaited)."""
        idle = self.d.cfg.wyoming.idle_timeout_s
        try:
            while True:
                try:
                    event = await asyncio.wait_for(async_read_event(self.reader), idle)
                except asyncio.TimeoutError:
                    await self.fail(f"no event for {idle:g} s; the connection is closed (wyoming.idle_timeout_s)",
                                    "timeout")
                    break
                if event is None or not await self.handle_event(event):
                    break
        finally:
            await self.disconnect()
            self.writer.close()

    async def write_event(self, event: Event) -> None:
        """Send an event; a client that reads none of it for wyoming.write_timeout_s is cut off (ClientStalled):
        the socket closes at once, dropping what is buffered, so a stalled client holds no handler for ever."""
        limit = self.d.cfg.wyoming.write_timeout_s
        try:
            await asyncio.wait_for(super().write_event(event), limit)
        except asyncio.TimeoutError:
            self.writer.transport.abort()
            log.info("wyoming client read nothing for %g s (wyoming.write_timeout_s); connection closed", limit)
            raise ClientStalled(f"the client read nothing for {limit:g} s") from None

    def info(self) -> Info:
        e = self.d.host.engine
        langs = language_tags(e.languages)
        names = e.voices or ["default"]
        voices = [TtsVoice(name=v, description=f"{e.model_type} voice {v}", attribution=ATTRIBUTION, installed=True,
                           version=None, languages=langs) for v in names]
        return Info(tts=[TtsProgram(name="tts-appliance", description="Qwen3-TTS on-prem appliance",
                                    attribution=ATTRIBUTION, installed=True, version="0.1.0", voices=voices,
                                    supports_synthesize_streaming=True)])

    async def handle_event(self, event: Event) -> bool:
        """Serve one event; False ends the connection (after an error event: see the module doc)."""
        try:
            return await self._handle(event)
        except (ConnectionError, BrokenPipeError, ClientStalled):
            raise
        except Exception as exc:  # a bug: this connection ends with an error event, the daemon goes on
            log.exception("wyoming: %s failed", event.type)
            return await self.fail(f"internal error: {type(exc).__name__}", "internal_error")

    async def fail(self, text: str, code: str) -> bool:
        """Send an error event; returns False: the connection is closed after it."""
        log.info("wyoming: %s (%s); closing the connection", text, code)
        await self.write_event(Error(text, code).event())
        self.failed = True
        return False

    async def disconnect(self) -> None:
        """After an error event, before the socket closes: the write side is shut first (the client reads the
        end and stops waiting), then what the client still sends (the rest of a text stream) is read and
        dropped until it closes, at most LINGER_S. A socket closed with unread data resets the connection:
        a client still writing would meet "connection reset" in place of the error and the end."""
        if not self.failed:
            return
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
            await asyncio.wait_for(self._discard_input(), LINGER_S)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass

    async def _discard_input(self) -> None:
        while await self.reader.read(65536):
            pass

    async def _handle(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.info().event())
        elif SynthesizeStart.is_type(event.type):
            self.stream_voice, self.stream_language = self.voice_of(event)
            self.stream_text, self.audio_started = "", False
        elif SynthesizeChunk.is_type(event.type):
            if self.stream_text is None:
                return await self.fail("synthesize-chunk without synthesize-start", "protocol")
            lang = language_code(self.stream_language) or "en"
            text = self.stream_text + SynthesizeChunk.from_event(event).text
            sentences, self.stream_text = split_streamed(text, lang)
            for s in sentences:
                if not await self.speak(s, self.stream_voice, self.stream_language):
                    return False
        elif SynthesizeStop.is_type(event.type):
            rest, self.stream_text = (self.stream_text or "").strip(), None
            if rest and not await self.speak(rest, self.stream_voice, self.stream_language):
                return False
            await self.end_audio()
            await self.write_event(SynthesizeStopped().event())
        elif Synthesize.is_type(event.type):
            if self.stream_text is not None:
                return True  # the non-streaming copy of an open text stream
            syn = Synthesize.from_event(event)
            self.audio_started = False
            if not await self.speak(syn.text, *self.voice_of(event)):
                return False
            await self.end_audio()
        else:
            log.debug("wyoming: ignoring %s", event.type)
        return True

    def voice_of(self, event: Event) -> tuple[Optional[str], str]:
        """(voice name or None, the model's language) of a synthesize or synthesize-start event. Read from
        the event's data: the package's SynthesizeVoice drops the language when a name is given."""
        voice = event.data.get("voice") or {}
        voice = voice if isinstance(voice, dict) else {}
        language = voice.get("language") or self.d.cfg.wyoming.default_language
        return voice.get("name") or None, model_language(language, self.d.host.engine.languages)

    async def end_audio(self) -> None:
        e = self.d.host.engine
        if not self.audio_started:
            await self.write_event(AudioStart(rate=e.sample_rate, width=2, channels=1).event())
        await self.write_event(AudioStop().event())
        self.audio_started = False

    async def speak(self, text: str, voice: Optional[str], language: str) -> bool:
        """Stream one piece of text as audio chunks -> True; False when the exchange is over: an error event
        was sent (the connection is to be closed), or the client is gone."""
        d = self.d
        voice = voice or d.cfg.wyoming.default_voice or d.host.default_voice()
        if voice == "default" and not d.host.engine.voices:
            voice = None
        try:
            text = file_lexicon(d.cfg.jobs.lexicon).apply(text)
        except LexiconError as exc:
            return await self.fail(str(exc), "lexicon")
        req = d.host.request(text, voice=voice, language=language)
        if req is None:
            return await self.fail("no voice: this Base checkpoint needs a saved voice (POST /v1/voices adds "
                                   "one; name it as the voice or set wyoming.default_voice)", "no_voice")
        try:
            async with serve_stream(d, "wyoming", req) as stream:
                async for chunk in stream.chunks():
                    if not self.audio_started:
                        await self.write_event(AudioStart(rate=stream.sample_rate, width=2, channels=1).event())
                        self.audio_started = True
                    await self.write_event(AudioChunk(rate=stream.sample_rate, width=2, channels=1,
                                                      audio=pcm16(chunk)).event())
                stream.outcome = "ok"
            return True
        except ShuttingDown as exc:
            return await self.fail(str(exc), "busy")
        except EngineBusy as exc:
            return await self.fail(f"{exc}; try again in {d.cfg.runtime.retry_after_s} s", "busy")
        except TTSError as exc:
            return await self.fail(str(exc), type(exc).__name__)
        except (ConnectionError, BrokenPipeError):
            log.info("wyoming client went away mid-stream; request cancelled")
            return False
        except ClientStalled:  # (said when it was closed)
            return False


async def client_connected(daemon, reader, writer) -> None:
    """asyncio server callback: serve one connection until it closes."""
    try:
        await TtsHandler(daemon, reader, writer).run()
    except (ConnectionError, BrokenPipeError, ClientStalled):
        pass
    except asyncio.IncompleteReadError as exc:  # the client closed in the middle of an event: normal
        log.info("wyoming client closed the connection mid-event (%d of %s bytes)", len(exc.partial), exc.expected)
    except Exception:
        log.exception("wyoming connection failed")
