"""The text of a live session (appliance.http_live) as it arrives, made into what is spoken, in order.

text_mode "words" (the default): the model's streaming-text mode (engines.runtime.text_feed). Each
complete word goes to the model as it comes, so audio starts after the first word; when the model has
used every word it has, its row waits for more (it never ends early on slow text). Text is spoken as
utterances of one request each: a new one starts at a sentence end after UTTERANCE_CHARS characters.
text_mode "sentences" (and any voice cloned with its reference text, which needs whole text): each
sentence is spoken once it is complete (`text.split.split_streamed`, as the Wyoming server does). With a
lexicon, text waits for the next space or punctuation mark before it is spoken (a word is replaced whole).
Text not yet spoken is capped at http.max_text_chars.
"""
from __future__ import annotations

import asyncio
from typing import Optional

from engines.runtime.text_feed import TextFeed
from text.lexicons import file_lexicon, merged
from text.normalize import language_code
from text.normalize.lexicon import LexiconError
from text.split import split_streamed

from appliance.http_common import ApiError

UTTERANCE_CHARS = 600  # words mode: an utterance ends at a sentence end once it holds this many characters
UTTERANCE_MAX_CHARS = 2400  # ... or at a word boundary past this many (about 600 tokens: within one request)
TEXT_MODES = ("words", "sentences")


class LiveText:
    """What a live session's text becomes, on `queue` in the order it is to be spoken: sentences (str) or, in
    words mode, utterances (a TextFeed each, fed new words while it is spoken). `opts`: the session's settings
    (voice, language, text_mode, lexicon), read at the first text."""

    def __init__(self, ctx, opts: dict):
        self.ctx, self.opts = ctx, opts
        self.words: Optional[bool] = None  # words mode, decided at the first text
        self.rest = ""  # sentences mode: text after the last complete sentence
        self.lexicon = None  # the session's pronunciation lexicon, set at the first text
        self.held = ""  # text not yet through the lexicon (after the last space or punctuation mark)
        self.feed: Optional[TextFeed] = None  # words mode: the utterance new text goes to
        self.came = asyncio.Event()  # set at every append/end (the speaker waits for a first word)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued_chars = 0  # text taken but not yet spoken

    @property
    def started(self) -> bool:
        """Text came: the session's settings can no longer change."""
        return self.words is not None

    def append(self, text: str) -> None:
        """More text to speak."""
        self.add(self._pronounce(text))

    def end(self) -> None:
        """No more text: what is held is queued."""
        held = self._pronounce("", final=True)
        if held:
            self.add(held)
        if self.feed is not None:
            self.feed.end()
            self.feed = None
        rest, self.rest = self.rest.strip(), ""
        if rest:
            self._queue(rest)
        self.came.set()

    def _pronounce(self, text: str, final: bool = False) -> str:
        """`text` through the session's lexicon; without `final`, what follows its last space or punctuation
        mark waits for the next piece (a word is replaced whole)."""
        if self.lexicon is None:
            try:
                self.lexicon = merged(file_lexicon(self.ctx.cfg.jobs.lexicon), self.opts["lexicon"])
            except LexiconError as exc:
                raise ApiError(400, str(exc)) from None
        if not self.lexicon:
            return text
        text, self.held = self.held + text, ""
        if not final:
            cut = max((i + 1 for i, ch in enumerate(text) if not (ch.isalnum() or ch == "_")), default=0)
            text, self.held = text[:cut], text[cut:]
            if len(self.held) > self.ctx.cfg.http.max_text_chars:
                raise ApiError(413, f"{len(self.held)} characters without a space or punctuation mark; the limit is "
                                    f"{self.ctx.cfg.http.max_text_chars}", "too_large")
        return self.lexicon.apply(text)

    def add(self, text: str) -> None:
        """Text (through the lexicon already) into sentences or utterances."""
        limit = self.ctx.cfg.http.max_text_chars
        buffered = self.queued_chars + len(self.rest) + len(text)
        if buffered > limit:
            raise ApiError(413, f"{buffered} characters of text wait to be spoken; the limit is {limit} "
                                "(send text no faster than it is spoken)", "too_large")
        if self.words is None:
            voice = self.opts["voice"] or self.ctx.host.default_voice()
            self.words = self.opts["text_mode"] == "words" and self.ctx.host.engine.streams_text(voice)
        lang = language_code(self.opts["language"]) or "en"
        if not self.words:
            sentences, self.rest = split_streamed(self.rest + text, lang)
            for s in sentences:
                self._queue(s)
            return
        self.queued_chars += len(text)
        while text:
            if self.feed is None:
                self.feed = TextFeed()
                self.queue.put_nowait(self.feed)
            cut = utterance_end(self.feed.text, text, lang)
            if cut is None:
                self.feed.append(text)
                break
            self.feed.append(text[:cut])
            self.feed.end()
            self.feed, text = None, text[cut:].lstrip()
        self.came.set()

    def _queue(self, sentence: str) -> None:
        self.queued_chars += len(sentence)
        self.queue.put_nowait(sentence)

    async def ready(self, item) -> bool:
        """Whether `item` (from the queue) has something to speak; an utterance is waited for until it holds a
        complete word or has ended (False: whitespace only)."""
        if not isinstance(item, TextFeed):
            return True
        while not item.ready()[0] and not item.ended:
            self.came.clear()
            await self.came.wait()
        return bool(item.ready()[0])

    def spoken(self, item) -> tuple[str, Optional[TextFeed]]:
        """`item`'s request has ended: (the text it spoke, the utterance that goes on with the words it did not
        take (it ended early, e.g. at max_frames) or None). Nothing awaits here: the reader, appending to
        `feed`, sees it move on at once."""
        if isinstance(item, str):
            self.queued_chars -= len(item)
            return item, None
        item.end()  # no more words go to it
        spoken, rest = item.text[:item.taken], item.rest
        self.queued_chars -= len(spoken)
        more = None
        if self.feed is item or rest.strip():
            more = TextFeed(rest)  # the words it did not take start the next utterance
            if self.feed is item:
                self.feed = more  # still receiving: new words go there
            else:
                more.end()
        return spoken.strip(), more


def utterance_end(current: str, text: str, lang: str) -> Optional[int]:
    """Where in `text` (appended to an utterance holding `current`) the utterance should end: after its last
    complete sentence once it holds UTTERANCE_CHARS characters, else at a word boundary once it would pass
    UTTERANCE_MAX_CHARS; None: all of `text` goes to this utterance."""
    total = len(current) + len(text)
    if total < UTTERANCE_CHARS:
        return None
    _, rest = split_streamed(current + text, lang)
    cut = total - len(rest) - len(current)
    if cut > 0:
        return cut
    if total <= UTTERANCE_MAX_CHARS:
        return None
    space = text.rfind(" ", 0, max(UTTERANCE_MAX_CHARS - len(current), 1))
    return space if space > 0 else max(UTTERANCE_MAX_CHARS - len(current), 1)
