"""User pronunciation dictionary: word or phrase -> replacement text.

Matching rules:

* Whole words only: ``"Qwen"`` never matches inside ``"Qwentin"``. Keys may
  contain spaces (phrases) and punctuation (``"Dr."``, ``"C++"``).
* A key written entirely in lowercase matches any capitalization
  (``"nginx"`` matches ``"Nginx"`` and ``"NGINX"``); when the matched text starts
  with a capital letter the replacement's first letter is capitalized too.
* A key containing any uppercase letter matches exactly that capitalization
  (``"US"`` does not touch ``"us"``); its replacement is used verbatim.
* Longer keys win over shorter ones (``"New York City"`` before ``"New York"``).
* Replacements are not re-scanned by the lexicon, but later normalization rules
  (numbers, abbreviations) still apply to them.

YAML formats accepted by :meth:`Lexicon.load`::

    Qwen: chwen            # flat mapping
    entries:               # or under an "entries" key
      nginx: engine x
    # or a list:  - {word: SQL, replacement: sequel}
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping, Optional, Union


class LexiconError(ValueError):
    """A user pronunciation dictionary could not be loaded (the message says which entry or file, and why)."""


class Lexicon:
    """An immutable-ish set of pronunciation replacements."""

    def __init__(self, entries: Optional[Mapping[str, str]] = None):
        self.entries: dict[str, str] = {}
        for key, value in (entries or {}).items():
            key = str(key).strip()
            if not key:
                continue
            if value is None:
                raise LexiconError(f"Lexicon entry {key!r} has no replacement.")
            self.entries[key] = str(value)
        self._pattern: Optional[re.Pattern] = None
        self._lookup: dict[str, str] = {}

    # -- construction --
    @classmethod
    def from_dict(cls, data: Union[Mapping, Iterable, None]) -> "Lexicon":
        """Build from a mapping, ``{"entries": mapping}`` or a list of ``{word, replacement}`` items."""
        if data is None:
            return cls()
        if isinstance(data, Mapping) and "entries" in data and len(data) <= 2:
            data = data["entries"] or {}
        if isinstance(data, Mapping):
            return cls(data)
        entries: dict[str, str] = {}
        for item in data:
            if not isinstance(item, Mapping):
                raise LexiconError(f"Lexicon list items must be mappings with word/replacement, got {item!r}.")
            word = item.get("word") or item.get("from")
            repl = item.get("replacement", item.get("to", item.get("say")))
            if word is None or repl is None:
                raise LexiconError(f"Lexicon item {dict(item)!r} needs 'word' and 'replacement'.")
            entries[str(word)] = str(repl)
        return cls(entries)

    @classmethod
    def load(cls, yaml_path: Union[str, Path]) -> "Lexicon":
        """Load a YAML lexicon file; raises LexiconError with a readable message."""
        import yaml

        path = Path(yaml_path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
        except FileNotFoundError:
            raise LexiconError(f"Lexicon file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise LexiconError(f"Cannot read lexicon file {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise LexiconError(f"Lexicon file {path} is not valid YAML: {exc}") from None
        if data is not None and not isinstance(data, (Mapping, list)):
            raise LexiconError(f"Lexicon file {path} must contain a mapping or a list of entries.")
        return cls.from_dict(data)

    def merge(self, other: Optional["Lexicon"]) -> "Lexicon":
        """Return a new lexicon with ``other``'s entries added; ``other`` wins on conflicts."""
        merged = dict(self.entries)
        if other is not None:
            merged.update(other.entries)
        return Lexicon(merged)

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    # -- application --
    def _compile(self) -> Optional[re.Pattern]:
        if self._pattern is None and self.entries:
            parts = []
            for key in sorted(self.entries, key=len, reverse=True):
                body = r"\s+".join(re.escape(w) for w in key.split())
                if key == key.lower():
                    body = f"(?i:{body})"
                    self._lookup[" ".join(key.split())] = self.entries[key]
                else:
                    self._lookup["\0" + " ".join(key.split())] = self.entries[key]
                parts.append(rf"(?<!\w){body}(?!\w)")
            self._pattern = re.compile("|".join(parts))
        return self._pattern

    def apply(self, text: str) -> str:
        """Replace every lexicon word/phrase in ``text``."""
        pattern = self._compile()
        if pattern is None:
            return text

        def repl(m: re.Match) -> str:
            found = " ".join(m.group().split())
            exact = self._lookup.get("\0" + found)
            if exact is not None:
                return exact
            value = self._lookup.get(found.lower())
            if value is None:  # pragma: no cover - regex and lookup agree
                return m.group()
            if found[:1].isupper() and value[:1].islower():
                value = value[0].upper() + value[1:]
            return value

        return pattern.sub(repl, text)
