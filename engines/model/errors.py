"""Errors a user can meet, each saying what to do about it."""
from __future__ import annotations


class TTSError(Exception):
    """Base class: an error caused by the user's input or files (shown without a traceback)."""


class CheckpointError(TTSError):
    """A checkpoint file is missing, corrupt or does not match the expected layout."""


class DeviceNotFound(TTSError):
    """The device an engine is configured for (model.device, --device) is not on this machine."""


class VoiceNotFound(TTSError):
    def __init__(self, name: str, available):
        avail = ", ".join(sorted(available)) or "(none)"
        super().__init__(f"unknown voice {name!r}; available: {avail}")


class LanguageNotSupported(TTSError):
    def __init__(self, name: str, available):
        super().__init__(f"unknown language {name!r}; available: {', '.join(available)}")


class UnsupportedMode(TTSError):
    """The request asks for something this checkpoint type cannot do (e.g. an instruction on Base)."""


class BadInput(TTSError):
    """Empty text, unreadable reference audio and the like."""


class EngineBusy(TTSError):
    """The admission queue is full: try again shortly."""


class EngineUnavailable(EngineBusy):
    """The engine (its process) stopped or is starting again: the request did not run; retry it."""
