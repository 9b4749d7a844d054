"""Errors raised by the jobs layer.

Every error carries a short, user-facing message (``str(err)``) that can be shown
as-is in the CLI or stored in the job queue.
"""
from __future__ import annotations


class JobError(Exception):
    """Base class for all job-level errors."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


class IngestError(JobError):
    """The input document could not be read (bad path, bad format, unsafe archive...)."""


class NotText(IngestError):
    """Bytes that should be text are binary or in no text encoding (the message says which)."""
