"""Text that is still arriving for one request: the model's streaming-text mode.

    feed = TextFeed("Hello there, ")
    handle = runner.submit(SynthesisRequest(text="", voice="ryan", text_feed=feed))
    feed.append("how are ")            # from any thread, as the words come
    feed.end()                         # no more text: the model may finish

In streaming-text mode Qwen3-TTS is given one text token per generated frame (engines.model.prompt).
The runner feeds a request's tokens as they come; when a request has used every token it has and
its text is not ended, its row is held (it makes no frame and its state does not move) until more
text arrives, so slow text never makes the model end early. Only complete words are fed: the text
after the last whitespace waits for the next append or the end (a word cut in two would tokenize
differently).
"""
from __future__ import annotations

import threading
from typing import Callable, Optional


class TextFeed:
    """Append-only text plus an end mark, shared between a producer thread and the engine runner."""

    def __init__(self, text: str = ""):
        self._lock = threading.Lock()
        self._text = text
        self._ended = False
        self.version = 0  # bumped on every change (the runner re-reads only then)
        self.on_change: Optional[Callable[[], None]] = None  # set by the runner: wakes its loop
        self.taken = 0  # characters of `text` the model has been given (see `take`)

    def append(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            if self._ended:
                raise ValueError("text appended after the feed was ended")
            self._text += text
            self.version += 1
        self._notify()

    def end(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            self.version += 1
        self._notify()

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def text(self) -> str:
        return self._text

    def ready(self) -> tuple[str, bool]:
        """(the text that may be spoken now, whether the feed has ended): everything once ended, else
        up to the last whitespace (complete words only)."""
        text, ended, _ = self._ready()
        return text, ended

    def take(self) -> tuple[str, bool]:
        """`ready()`, recording that the model has been given that text (the runner calls this)."""
        text, ended, cut = self._ready()
        self.taken = cut
        return text, ended

    @property
    def rest(self) -> str:
        """The text the model has not been given (e.g. when its request ended at a frame cap)."""
        return self._text[self.taken:]

    def _ready(self) -> tuple[str, bool, int]:
        with self._lock:
            text, ended = self._text, self._ended
        if ended:
            cut = len(text)
        else:
            cut = max(text.rfind(c) for c in " \t\n\r\u3000")
            if cut < 0:  # one word so far; in a script written without spaces, all but the last character
                cut = len(text) - 1 if _unspaced(text) else 0
        return text[:cut].strip(), ended, cut

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _unspaced(text: str) -> bool:
    """Text in a script written without spaces (Chinese, Japanese)."""
    return any("\u3040" <= c <= "\u30ff" or "\u4e00" <= c <= "\u9fff" for c in text)
