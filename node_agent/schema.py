"""Dataclasses recorded as JSON: each field names, in its metadata, the key it is recorded under.

A field's ``Key`` (given with ``key(...)`` as the field's ``metadata``) says what the key is called,
how its value is read and written (its ``Codec``), and what a summary shows of it. ``read`` and
``write`` follow the keys of a class, so the format of a class is its field list and nothing else.

Reading a key: its value goes through the codec's ``read``, which raises ``FixtureError`` naming
the key's path (``gpus[0].nvlinks[3].active``) or answers ``DEFAULT``. An absent key (and a
``DEFAULT`` answer) leaves the field at its default; a field without a default reads an absent key
as null.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from node_agent.errors import FixtureError

T = TypeVar("T")

_METADATA = "fiar.key"


def short(value: Any) -> str:
    """A bounded repr of an untrusted value for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def path(where: str, name: str) -> str:
    """The path of key ``name`` inside the entry at ``where`` (the document itself: ``""``)."""
    return f"{where}.{name}" if where else name


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()
"""A codec's answer for a value that leaves the field at its default (an empty list, say)."""


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Codec:
    """How one field's value is read (``read(raw, where)``) and written back (``write(value)``)."""

    read: Callable[[Any, str], Any]
    write: Callable[[Any], Any] = _same

    def read_in(self, entry: Mapping[str, Any], key: Key, where: str, required: bool) -> Any:
        """The field's value in ``entry``, the entry at ``where`` (``DEFAULT``: keep the default)."""
        for name in (key.name, *key.read_also):
            if name in entry:
                return self.read(entry[name], path(where, key.name))
        return self.read(None, path(where, key.name)) if required else DEFAULT

    def write_in(self, value: Any, key: Key) -> dict[str, Any]:
        """The keys ``value`` is recorded under."""
        return {key.name: self.write(value)}


@dataclass(frozen=True, eq=False)
class Key:
    """Where and how one field is recorded."""

    name: str
    codec: Codec
    read_also: tuple[str, ...] = ()
    """Other names read when ``name`` is absent (another version's spelling)."""
    native: int | None = None
    """The NVML or CUDA enum value the field is read from the hardware with."""
    beside: bool = False
    """Recorded beside the entry rather than in it (``inventory``: one list per such field)."""
    shows: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    """Entries of a summary made of this field: name -> function (``inventory.summary`` says of what)."""


def key(name: str, codec: Codec, **options: Any) -> Mapping[str, Key]:
    """A field's ``metadata``: the key it is recorded under (options: those of ``Key``)."""
    return {_METADATA: Key(name, codec, **options)}


@dataclass(frozen=True)
class Recorded:
    """One recorded field of a class."""

    attr: str
    key: Key
    required: bool
    """The field has no default."""


_FIELDS: dict[type, tuple[Recorded, ...]] = {}


def fields(cls: type) -> tuple[Recorded, ...]:
    """The recorded fields of the dataclass ``cls``, in order."""
    if cls not in _FIELDS:
        _FIELDS[cls] = tuple(
            Recorded(f.name, f.metadata[_METADATA], f.default is f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls)
            if _METADATA in f.metadata
        )
    return _FIELDS[cls]


def read(cls: type[T], raw: Any, where: str) -> T:
    """A ``cls`` from its recorded entry ``raw`` found at ``where``; raises ``FixtureError``."""
    if not isinstance(raw, Mapping):
        raise FixtureError(f"{where}: expected an object")
    values: dict[str, Any] = {}
    for f in fields(cls):
        if not f.key.beside:
            value = f.key.codec.read_in(raw, f.key, where, f.required)
            if value is not DEFAULT:
                values[f.attr] = value
    return cls(**values)


def write(obj: Any) -> dict[str, Any]:
    """The recorded entry of ``obj``, keys in field order (fields recorded beside it left out)."""
    entry: dict[str, Any] = {}
    for f in fields(type(obj)):
        if not f.key.beside:
            entry.update(f.key.codec.write_in(getattr(obj, f.attr), f.key))
    return entry


def recorded(cls: type, **values: Any) -> dict[str, Any]:
    """The keys and recorded values of some fields of ``cls``, given by attribute."""
    by_attr = {f.attr: f.key for f in fields(cls)}
    unknown = sorted(set(values) - set(by_attr))
    if unknown:
        raise TypeError(f"{cls.__name__} records no field {', '.join(unknown)}")
    return {by_attr[a].name: by_attr[a].codec.write(v) for a, v in values.items()}


def in_order(values: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``values`` with ``keys`` first, in that order, and any others after them."""
    return {**{k: values[k] for k in keys if k in values}, **values}


# -- codecs ----------------------------------------------------------------------------------------


def _int(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise FixtureError(f"{where}: expected an integer, got {short(raw)}")
    return raw


def _int_or_none(raw: Any, where: str) -> int | None:
    return None if raw is None else _int(raw, where)


def _text(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise FixtureError(f"{where}: expected a string, got {short(raw)}")
    return raw


def _text_or_none(raw: Any, where: str) -> str | None:
    return None if raw is None else _text(raw, where)


def _texts(raw: Any, where: str) -> Any:
    if not raw:
        return DEFAULT
    if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw):
        raise FixtureError(f"{where}: expected a list of strings, got {short(raw)}")
    return tuple(raw)


def _text_map(raw: Any, where: str) -> Any:
    if not raw:
        return DEFAULT
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise FixtureError(f"{where}: expected an object of strings")
    return dict(raw)


INT: Final = Codec(_int)
"""An integer (not a bool; null is none)."""
INT_OR_NONE: Final = Codec(_int_or_none)
TEXT: Final = Codec(lambda raw, where: _text(raw, where) or DEFAULT)
"""A string; an empty one keeps the default."""
TEXT_OR_NONE: Final = Codec(_text_or_none)
FLAG: Final = Codec(lambda raw, where: bool(_int_or_none(raw, where)), int)
"""A bool recorded as 0 or 1 (null: 0)."""
BOOL_OR_NONE: Final = Codec(lambda raw, where: None if raw is None else bool(raw))
"""None for null; anything else read as a bool."""
TEXTS: Final = Codec(_texts, list)
"""A list of strings (null or empty: the default)."""
TEXT_MAP: Final = Codec(_text_map, dict)
"""An object of strings (null or empty: the default)."""


def optional(cls: type) -> Codec:
    """One ``cls`` entry, or null."""
    return Codec(
        lambda raw, where: None if raw is None else read(cls, raw, where),
        lambda value: None if value is None else write(value),
    )


def entries(cls: type, numbered: str | None = None) -> Codec:
    """A list of ``cls`` entries (null or empty: the default). ``numbered``: the field an entry
    without it takes its position in the list as."""

    def read_list(raw: Any, where: str) -> Any:
        if not raw:
            return DEFAULT
        if not isinstance(raw, list):
            raise FixtureError(f"{where}: expected a list, got {short(raw)}")
        return tuple(
            read(cls, {numbered: i, **e} if numbered and isinstance(e, Mapping) else e, f"{where}[{i}]")
            for i, e in enumerate(raw)
        )

    return Codec(read_list, lambda values: [write(v) for v in values])


def _pair(text: str, where: str) -> tuple[int, int]:
    try:
        a, b = text.split("->")
        return int(a), int(b)
    except ValueError as exc:
        raise FixtureError(f"{where}: bad key {text!r}, expected 'a->b'") from exc


def pairs(cls: type) -> Codec:
    """An object of ``cls`` entries keyed ``'a->b'`` by a pair of GPU indexes (null or empty: the
    default), written in pair order."""

    def read_pairs(raw: Any, where: str) -> Any:
        if not raw:
            return DEFAULT
        if not isinstance(raw, dict):
            raise FixtureError(f"{where}: expected an object keyed 'a->b'")
        return {_pair(k, where): read(cls, v, f"{where}[{k}]") for k, v in raw.items()}

    return Codec(read_pairs, lambda value: {f"{a}->{b}": write(v) for (a, b), v in sorted(value.items())})
