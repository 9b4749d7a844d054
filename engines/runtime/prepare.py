"""A request made ready for the model when the scheduler admits it, and live text fed as it comes.

- `prepare(seq, engine, max_context)`: the request's voice, prompt and sampling settings (the checkpoint's
  `TTSEngine.resolve` and `sampling`), its frame limit fitted to the context; a request whose text is still
  arriving (engines.runtime.text_feed) starts in streaming-text mode over the words there so far.
- `feed_text(seqs, prompts, table, cap)`: between steps, every running request whose feed changed gets its
  new complete words as text rows in its slot (and tts_eos once its text has ended).

The runner (engines.runtime.runner) calls both from its loop; nothing here touches the device but the
slot table's text rows.
"""
from __future__ import annotations

import logging
from dataclasses import replace

from engines.model.errors import TTSError, UnsupportedMode
from engines.runtime.sequence import Sequence

log = logging.getLogger(__name__)


def prepare(seq: Sequence, engine, max_context: int) -> None:
    """Fill `seq.prompt`, `seq.settings` and `seq.ref_codes` from its request on `engine` (a TTSEngine).
    TTSError when the request cannot be spoken (its text too long for `max_context`, a bad voice, ...). Also
    `seq.reserve`, the cache positions it may come to hold. A request prepared before (sent back to the queue
    to wait for memory, `EngineRunner._admit`) keeps what it has, unless its text is still arriving."""
    if seq.feed is None and seq.prompt is not None:  # prepared before, then sent back to wait for memory
        return
    if seq.feed is None:
        spec, ref_codes = engine.resolve(seq.request)
        seq.prompt = engine.prompts.build(spec)
        seq.settings = engine.sampling(seq.request.sampling, seq.request.text)
    else:
        spec, ref_codes = _prepare_feed(seq, engine)
    need = seq.prompt.prefill.shape[0] + seq.settings.max_new_tokens + 1
    if need > max_context:
        seq.settings = replace(seq.settings, max_new_tokens=max_context - seq.prompt.prefill.shape[0] - 1)
        if seq.settings.max_new_tokens < 2:
            raise TTSError(f"text too long for one request ({seq.prompt.prefill.shape[0]} prompt tokens); "
                           "split it into shorter segments")
    seq.ref_codes = ref_codes
    seq.reserve = min(max_context, seq.prompt.prefill.shape[0] + seq.settings.max_new_tokens + 1)


def _prepare_feed(seq: Sequence, engine):
    """A request whose text is still arriving: streaming-text mode over the words there so far."""
    feed = seq.feed
    seq.feed_version = feed.version
    text, ended = feed.take()
    if not text:
        raise TTSError("no complete word to speak yet: append text (ending in a space) or end the feed "
                       "before submitting")
    req = replace(seq.request, text=text, non_streaming_text=False)
    spec, ref_codes = engine.resolve(req)
    if ref_codes is not None:
        raise UnsupportedMode("text that is still arriving cannot be spoken with a voice cloned with its "
                              "reference text (ICL needs the whole text up front); use a voice saved without "
                              "reference text, or send whole sentences")
    seq.prompt = engine.prompts.build(spec, text_open=not ended)
    seq.settings = engine.sampling(req.sampling, None)
    seq.fed_ids = engine.prompts.text_ids(text)
    seq.text_rows = seq.prompt.trailing.shape[0]
    seq.text_open = not ended
    return spec, ref_codes


def feed_text(seqs: list, prompts, table, cap: int) -> None:
    """Give each running request of `seqs` whose feed changed its new complete words (and tts_eos at its
    end): `prompts` (engines.model.prompt.PromptBuilder) makes the rows, `table` (the model runner's slot
    table) takes them; `cap`: text rows a request may hold in all (EngineConfig.max_text_rows)."""
    for seq in seqs:
        if not seq.text_open or seq.feed.version == seq.feed_version:
            continue
        seq.feed_version = seq.feed.version
        text, ended = seq.feed.take()
        ids = prompts.text_ids(text) if text else []
        if ids[:len(seq.fed_ids)] != seq.fed_ids:
            log.debug("live text re-tokenized differently at a word boundary; going on from token %d",
                      len(seq.fed_ids))
        new = ids[len(seq.fed_ids):]
        room = cap - seq.text_rows - 1  # one row kept for tts_eos
        if len(new) > room:
            log.warning("text still arriving passed %d tokens for one request: ending it there "
                        "(start a new request for the rest)", cap)
            new, ended = new[:max(room, 0)], True
        if not new and not ended:
            continue
        rows = prompts.text_rows(new, end=ended)
        table.append_text(seq.slot, seq.text_rows, rows, ended)
        seq.text_rows += rows.shape[0]
        seq.fed_ids += new
        seq.text_open = not ended
        seq.held = seq.member.stalled = False
