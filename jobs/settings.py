"""Job settings, spool folder layout and the content key of a segment.

The spool folder ("home") holds everything the batch side keeps on disk:

    queue.db      SQLite queue (jobs, chapters, segments, audio cache, events)
    audio/        content-addressed segment audio (audio/ab/abcdef....wav)
    output/       finished books, one folder per job (chapter files, book file, manifest.json)
    inbox/        watched folder; processing/, done/, failed/ next to it
    spool.id      the folder's identity: daemons sharing a queue compare it (jobs.queue.daemons)

It is `jobs.home` of the settings (`appliance.config.resolve`: `--home`, the config files,
`TTS_APPLIANCE_HOME`), else `~/.local/share/tts-appliance`.
"""
from __future__ import annotations

import hashlib
import json
import os
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

DEFAULT_HOME = Path("~/.local/share/tts-appliance")
FORMATS = ("wav", "flac", "opus", "mp3", "m4b", "epub")  # the audio ones are the speech API's names (opus: Ogg Opus)
# epub: a narrated EPUB (EPUB 3 with Media Overlays, jobs.narrated) with its audio as mp3, an EPUB core media type
AUDIO_FORMATS = {"epub": "mp3"}


def audio_format(fmt: str) -> str:
    """The format of a job's audio files (chapters, book) for its `format`."""
    return AUDIO_FORMATS.get(fmt, fmt)
FORMAT_ALIASES = {"ogg": "opus"}  # earlier name, still read from stored jobs, sidecars and API specs


@dataclass(frozen=True)
class Paths:
    """Locations inside one spool folder."""

    home: Path
    queue: Optional[str] = None  # jobs.queue: a postgresql:// URL or a SQLite file; None: the SQLite file below
    queue_file: Optional[str] = None  # jobs.queue_file: a file holding jobs.queue (read when the queue is opened)

    @property
    def db(self) -> Path | str:
        """Where the queue lives: what `jobs.queue.Queue` opens. QueueError when jobs.queue or the
        file of jobs.queue_file names none (`jobs.queue.location.parse_location`)."""
        from jobs.queue import QueueError
        from jobs.queue.location import parse_location, read_location_file

        try:
            if self.queue_file:
                return read_location_file(self.queue_file)
            return parse_location(self.queue) if self.queue else self.home / "queue.db"
        except ValueError as exc:
            raise QueueError(str(exc)) from None

    @property
    def audio(self) -> Path:
        return self.home / "audio"

    @property
    def output(self) -> Path:
        return self.home / "output"

    @property
    def inbox(self) -> Path:
        return self.home / "inbox"

    @property
    def processing(self) -> Path:
        return self.home / "processing"

    @property
    def done(self) -> Path:
        return self.home / "done"

    @property
    def failed(self) -> Path:
        return self.home / "failed"

    def ensure(self) -> "Paths":
        """Create the folders (idempotent) and return self."""
        for p in (self.home, self.audio, self.output, self.inbox, self.processing, self.done, self.failed):
            p.mkdir(parents=True, exist_ok=True)
        return self


def resolve_home(home: Optional[str | os.PathLike] = None, queue: Optional[str] = None,
                 queue_file: Optional[str] = None) -> Paths:
    """The spool folder: `home` (the settings' jobs.home), else ~/.local/share/tts-appliance; `queue`,
    `queue_file`: the settings' jobs.queue, jobs.queue_file."""
    return Paths(Path(home or DEFAULT_HOME).expanduser().resolve(), queue or None, queue_file or None)


def _plain_types(cls) -> dict[str, type]:
    """Field name -> the type a JSON value must have (Optional[X] -> X) of a dataclass."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if type(None) in typing.get_args(hint) else hint
        out[name] = typing.get_origin(base) or base
    return out


def _type_ok(value, typ: type) -> bool:
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, typ) and not (typ is int and isinstance(value, bool))


def _valid_keys(types: dict[str, type]) -> str:
    return ", ".join(f"{k} ({t.__name__})" for k, t in types.items())


def unknown_keys(data: dict, types: dict[str, type], what: str, done: str = "") -> Optional[str]:
    """None when every key of `data` is one of `types`; else one line naming the unknown keys (`done`: what
    became of them, e.g. ", ignored") and the valid keys with their types."""
    unknown = sorted(map(str, set(data) - set(types)))
    if not unknown:
        return None
    label = f"{what} " if what else ""
    return f"unknown {label}key(s) {', '.join(map(repr, unknown))}{done}; valid keys: {_valid_keys(types)}"


def check_keys(data, types: dict[str, type], what: str) -> dict:
    """`data` must be a mapping of known keys with values of their types (None allowed: the default);
    raises ValueError naming the key and listing the valid keys with their types."""
    valid = _valid_keys(types)
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object; valid keys: {valid}")
    unknown = unknown_keys(data, types, what)
    if unknown:
        raise ValueError(unknown)
    for key, value in data.items():
        if value is not None and not _type_ok(value, types[key]):
            raise ValueError(f"{what} key {key!r} must be {types[key].__name__}, got {value!r}; valid keys: {valid}")
    return data


@dataclass
class JobSpec:
    """What the user asked for; stored as JSON on the job row.

    `sampling` holds `engines.api.SamplingParams` overrides other than the seed (e.g.
    `{"max_new_tokens": 200}`); `seed` is the base seed of every segment (a redo may give one
    segment its own seed). `chapters` selects chapters by number as `tts-appliance preview` lists
    them ("1,3-5"; None: all); `chapter_voices` maps a chapter number to its voice (e.g. {"2": "ryan"});
    `speed` (0.25-4.0; natural within 0.5-2.0) time-stretches the book's audio, pitch kept. `lexicon`:
    pronunciation entries (word or phrase -> what to say, `jobs.normalize.lexicon`), the jobs.lexicon file's
    under the job's own.
    """

    voice: Optional[str] = None
    language: str = "auto"
    instruct: Optional[str] = None
    ref_audio: Optional[str] = None
    ref_text: Optional[str] = None
    format: str = "flac"
    title: Optional[str] = None
    author: Optional[str] = None
    priority: int = 0
    model: Optional[str] = None
    seed: int = 0
    sampling: dict = field(default_factory=dict)
    chapters: Optional[str] = None
    chapter_voices: dict = field(default_factory=dict)
    speed: float = 1.0
    lexicon: dict = field(default_factory=dict)

    def __post_init__(self):
        self.format = (self.format or "flac").lower()
        self.format = FORMAT_ALIASES.get(self.format, self.format)
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r}: choose one of {', '.join(FORMATS)}")
        from audio.speed import check_speed
        from jobs.preview import check_chapter_ranges

        if self.chapters is not None:  # YAML reads `chapters: 3` as a number
            self.chapters = check_chapter_ranges(str(self.chapters))
        self.chapter_voices = {str(k): str(v) for k, v in (self.chapter_voices or {}).items()}
        self.speed = check_speed(self.speed)
        from text.normalize.lexicon import LexiconError
        from text.lexicons import lexicon_entries

        try:
            self.lexicon = lexicon_entries(self.lexicon or None, "spec")
        except LexiconError as exc:
            raise ValueError(str(exc)) from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def unknown(cls, data: dict) -> Optional[str]:
        """What `from_dict` ignores of `data`: None, or one line naming those keys and the valid ones."""
        return unknown_keys(data, _plain_types(cls), "", ", ignored")

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        """Build from a stored mapping (JSON row, sidecar YAML), ignoring unknown keys (`unknown` names them)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names and v is not None})

    @classmethod
    def parse(cls, data) -> "JobSpec":
        """Strict parsing of what a client sent: a mapping (or its JSON text) of JobSpec fields with
        values of the fields' types (null: the default), `sampling` keys those of
        engines.api.SamplingParams except the seed. Raises ValueError naming the key and the valid ones."""
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ValueError(f"spec is not valid JSON: {exc}") from None
        check_keys(data, _plain_types(cls), "spec")
        from engines.api import SamplingParams

        sampling = {k: t for k, t in _plain_types(SamplingParams).items() if k != "seed"}
        check_keys(data.get("sampling") or {}, sampling, "spec.sampling")
        return cls(**{k: v for k, v in data.items() if v is not None})


def with_defaults(given: Optional[dict], defaults: Optional[dict]) -> dict:
    """`given` (a spec mapping as sent or read from a sidecar) with every key that is absent or None
    taken from `defaults` (e.g. the jobs.voice / jobs.language / jobs.instruct of the settings); the
    lexicons are merged, the given entries on top."""
    out = {k: v for k, v in (defaults or {}).items() if v is not None}
    out.update({k: v for k, v in (given or {}).items() if v is not None})
    lexicons = [d.get("lexicon") for d in (defaults, given) if d and isinstance(d.get("lexicon"), dict)]
    if len(lexicons) == 2:
        out["lexicon"] = {**lexicons[0], **lexicons[1]}
    return out


def file_digest(path: Optional[str]) -> Optional[str]:
    """sha256 of a file's content (the path itself when it is not a readable file; None for None)."""
    if not path or not Path(path).is_file():
        return path
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def segment_key(text: str, spec: JobSpec, seed: int, model_id: str, ref_digest: Optional[str] = None) -> str:
    """Content key of one segment's audio: same inputs -> same key -> cached audio is reused.

    Covers the normalized text, voice, language, instruction, reference audio (by content) and
    text, all sampling settings including the seed, and the engine's model id. `ref_digest`: the
    reference audio's `file_digest`, when the caller already has it (else it is computed here).
    """
    payload = {
        "text": text,
        "voice": spec.voice,
        "language": spec.language,
        "instruct": spec.instruct,
        "ref_audio": ref_digest if ref_digest is not None else file_digest(spec.ref_audio),
        "ref_text": spec.ref_text,
        "sampling": dict(sorted((spec.sampling or {}).items())),
        "seed": int(seed),
        "model": model_id,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()
