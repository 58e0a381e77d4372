"""The text rules every reader applies: size, encoding, binary content, visible characters, writable ids.

:func:`check_bytes` and :func:`check_text` say why a document cannot be classified (or return its
text); :func:`checked_id` and :func:`escape_surrogates` keep an id with a lone surrogate writable
as UTF-8; :func:`wide_encoding` names a UTF-16/UTF-32 file with the ``iconv`` command that
converts it. The readers are :mod:`classify.documents.read` (folders, JSONL) and
:mod:`batch.corpus.tabular` (CSV, Parquet). :func:`normalise_text` drops what carries no text (invisible
characters, whitespace padding) before a document is tokenised (:class:`classify.engine.prompt.PromptBuilder`).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path
from typing import NamedTuple

from classify.errors import InputError
from classify.records import Document
from classify.runs.files import NotRegularFile, open_regular

CONTROL_SHARE_LIMIT = 0.10
"""Above this share of control characters (other than tab/newline/CR) a text counts as binary."""

_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")
"""The control characters counted by :func:`check_text` (below U+0020, except tab, newline and CR)."""
_CONTROL_BYTES = bytes(c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D))
"""The same characters as UTF-8 bytes (one byte each; no other character's UTF-8 holds a byte below 0x80)."""

INVISIBLE_CATEGORIES = frozenset({"Cf", "Cc", "Cs", "Zs", "Zl", "Zp"})
"""General categories with no glyph of their own: format, control, surrogate, space, line and paragraph separators."""

DEFAULT_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)
"""Default_Ignorable_Code_Point, inclusive ranges, from the Unicode Character Database file
``DerivedCoreProperties.txt`` (https://www.unicode.org/Public/UCD/latest/ucd/DerivedCoreProperties.txt;
the property is defined in UAX #44, https://www.unicode.org/reports/tr44/#Default_Ignorable_Code_Point,
and its rendering in The Unicode Standard, section 5.21 "Ignoring Characters in Processing").
It adds fillers that are letters by category (U+115F, U+1160, U+3164, U+FFA0), variation selectors
(U+180B..U+180D, U+180F, U+FE00..U+FE0F, U+E0100..U+E01EF) and reserved ignorables to the
format characters."""

_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (b"\x00\x00\xfe\xff", "UTF-32 BE", "UTF-32"),
    (b"\xff\xfe\x00\x00", "UTF-32 LE", "UTF-32"),
    (b"\xfe\xff", "UTF-16 BE", "UTF-16"),
    (b"\xff\xfe", "UTF-16 LE", "UTF-16"),
)


def escape_surrogates(text: str) -> str:
    """``text`` with every lone surrogate written as the literal text ``\\udXXX`` (other text unchanged).

    This is Python's ``backslashreplace`` error handler applied while encoding to UTF-8, so the
    result is always encodable, the same input always gives the same result, and text without
    surrogates comes back unchanged. Two ids that differ only in that one has a surrogate where the
    other has its escape text end up equal and are then rejected as duplicates, never merged silently.

    Args:
        text: any Python string (from JSON, a file name decoded with ``surrogateescape``...).

    Returns:
        A string that encodes as UTF-8, e.g. ``"a\\ud83d"`` (backslash, ``ud83d``) for ``"a\ud83d"``.

    Example:
        >>> escape_surrogates("x\ud83d")
        'x\\\\ud83d'
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def lone_surrogate(text: str) -> tuple[int, int] | None:
    """Where ``text`` first holds a lone surrogate (U+D800..U+DFFF), which UTF-8 cannot encode.

    Returns:
        ``(index, code point)`` of the first one, or ``None`` when ``text`` encodes as UTF-8.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start, ord(text[err.start])
    return None


def surrogate_reason(what: str, text: str) -> str | None:
    found = lone_surrogate(text)
    if found is None:
        return None
    index, cp = found
    return (f"{what} is not valid Unicode: lone surrogate U+{cp:04X} at character {index} (half of a UTF-16 pair, "
            "e.g. a JSON \\u escape without its partner); write whole characters as UTF-8")


def has_visible_char(text: str) -> bool:
    """Whether ``text`` holds at least one character that is drawn.

    Invisible are the general categories Cf, Cc, Cs, Zs, Zl and Zp (:data:`INVISIBLE_CATEGORIES`)
    and the Default_Ignorable_Code_Point set (:data:`DEFAULT_IGNORABLE_RANGES`, from the Unicode
    Character Database's ``DerivedCoreProperties.txt``). Right-to-left letters, emoji (even in
    sequences joined by U+200D or styled by U+FE0F) and combining marks on a base are visible.

    Args:
        text: decoded text.

    Returns:
        ``True`` when one character is neither in those categories nor default-ignorable.
    """
    for ch in text:
        cp = ord(ch)
        if unicodedata.category(ch) in INVISIBLE_CATEGORIES:
            continue
        if cp < 0x80 or not any(lo <= cp <= hi for lo, hi in DEFAULT_IGNORABLE_RANGES):  # no ASCII is ignorable
            return True
    return False


def wide_encoding(head: bytes) -> tuple[str, str] | None:
    """Recognise UTF-16 or UTF-32 from a file's first bytes (its byte-order mark, or UTF-16 without one).

    Args:
        head: the first 4 bytes (or more) of the file.

    Returns:
        ``(description, iconv source encoding)``, e.g. ``("UTF-16 LE (byte-order mark FF FE)", "UTF-16")``;
        ``None`` when the bytes do not look like UTF-16 or UTF-32. Without a byte-order mark only UTF-16
        whose first two characters are ASCII is recognised (a zero byte beside each ASCII byte); a UTF-16
        mark followed by an ASCII byte with no zero beside it is a stray mark on a UTF-8 file (``None``:
        its first line is then rejected as not UTF-8, and the rest is read).
    """
    if head and 0 < head[0] < 0x80 and (len(head) < 2 or head[1]):
        return None  # the common case, an ASCII first byte: no mark starts so, and UTF-16 would have a zero beside it
    for bom, name, iconv in _BOMS:
        if head.startswith(bom):
            if len(bom) == 2 and len(head) >= 4 and 0 < head[2] < 0x80 and head[3]:
                return None  # a UTF-16 mark, then an ASCII byte with no zero beside it: a stray mark on a UTF-8 line
            return f"{name} (byte-order mark {bom.hex(' ').upper()})", iconv
    if len(head) >= 4 and head[0] and head[2] and not head[1] and not head[3] and head[0] < 0x80 and head[2] < 0x80:
        return "UTF-16 LE without a byte-order mark", "UTF-16LE"
    if len(head) >= 4 and head[1] and head[3] and not head[0] and not head[2] and head[1] < 0x80 and head[3] < 0x80:
        return "UTF-16 BE without a byte-order mark", "UTF-16BE"
    return None


COMPRESSIONS = (  # (magic bytes, name, the command that decompresses a file)
    (b"\x1f\x8b", "gzip", "gunzip -k"),
    (b"\xfd7zXZ\x00", "xz", "unxz -k"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
    (b"PK\x03\x04", "zip", "unzip"),
    *((b"BZh" + bytes([d]), "bzip2", "bunzip2 -k") for d in b"123456789"),
)
"""Compressed formats recognised by their first bytes (the file's magic number, as ``file(1)`` reads it)."""

NOT_TEXT_REASONS = ("binary content", "not valid UTF-8", "not UTF-8", "compressed", "not valid JSON")
"""Reject reasons that say a document's bytes are not text (a reason holding one of these)."""


def compression_of(head: bytes, name: str = "") -> tuple[str, str] | None:
    """The compression of a file from its first bytes, or else from its name's suffix.

    Args:
        head: the file's first 6 bytes (or more).
        name: the file or object name; its suffix is read as fsspec reads it (:func:`fsspec.utils.infer_compression`:
            ``.gz``, ``.bz2``, ``.xz``, ``.zst``, ``.zip``, ``.lz4`` ...).

    Returns:
        ``(name, decompress command)``, e.g. ``("gzip", "gunzip -k")``; ``None`` for bytes that are not compressed
        under a name that does not say so.
    """
    for magic, kind, command in COMPRESSIONS:
        if head.startswith(magic):
            return kind, command
    if name:
        from fsspec.utils import infer_compression

        kind = infer_compression(name)
        if kind is not None:
            return kind, next((c for _, k, c in COMPRESSIONS if k == kind), f"decompress ({kind})")
    return None


def not_text_reason(reason: str) -> bool:
    """Whether a reject reason (or its part before the first ``:``) says the bytes are not text (:data:`NOT_TEXT_REASONS`)."""
    return any(r in reason for r in NOT_TEXT_REASONS)


def refuse_compressed(path: Path | str, head: bytes) -> None:
    """Refuse a compressed corpus file by name before anything is planned: docpilot reads JSONL and CSV as text.

    Args:
        path: the file or object (its name's suffix counts too).
        head: its first 6 bytes.

    Raises:
        InputError: ``corpus.jsonl is gzip-compressed (...); docpilot reads JSONL and CSV corpora uncompressed:
            decompress it first: gunzip -k ...``.
    """
    found = compression_of(head, str(path))
    if found is None:
        return
    kind, command = found
    magic = next((m for m, _, _ in COMPRESSIONS if head.startswith(m)), None)
    how = f"first bytes {magic.hex(' ').upper()}" if magic else "by its name"
    fix = (f"`aws s3 cp {path} - | {command.split()[0]} -c > corpus.jsonl` (or the store's own copy), then give that file"
           if "://" in str(path) else f"`{command} {path}`, then give the decompressed file")
    raise InputError(f"{path} is {kind}-compressed ({how}); docpilot reads JSONL and CSV corpora as uncompressed text "
                     f"(an object's Content-Encoding is not undone either): decompress it first: {fix}")


def refuse_wide_file(path: Path) -> None:
    """Refuse a UTF-16/UTF-32 input file by name, with the command that converts it to UTF-8.

    Args:
        path: a CSV, JSONL or labels file about to be read as UTF-8.

    Raises:
        InputError: the path is a FIFO, a device or a socket (never read: :func:`classify.runs.files.open_regular`),
            the file is compressed (:func:`refuse_compressed`: gzip, bzip2, xz, zstd, zip, lz4), or
            the file starts like UTF-16 or UTF-32 (:func:`wide_encoding`), e.g.
            ``c.csv is UTF-16 LE (byte-order mark FF FE), not UTF-8; convert it: iconv -f UTF-16 -t UTF-8 ...``.
    """
    try:  # a corpus object in a store (batch.corpus.source.StoreObject) opens itself
        with open_regular(path) if isinstance(path, str | Path) else path.open("rb") as fh:
            head = fh.read(6)
            found = wide_encoding(head[:4])
    except NotRegularFile as err:  # a FIFO would block every reader that follows: refused before any read
        raise InputError(f"{path} is {err.kind}, not a regular file; give a regular JSONL or CSV file") from None
    except OSError:
        return  # the reader that follows reports the OS error in its own words
    refuse_compressed(path, head)
    if found is not None:
        name, iconv = found
        converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
        raise InputError(f"{path} is {name}, not UTF-8; convert it: iconv -f {iconv} -t UTF-8 {path} > {converted}")


def checked_id(doc: Document) -> Document:
    """``doc`` with an id (and source) that can be written as UTF-8; a lone surrogate in the id rejects it.

    Args:
        doc: a document as a reader built it, with the id given by the input.

    Returns:
        ``doc`` itself when its id and source encode as UTF-8; otherwise a rejected document whose
        id and source are :func:`escape_surrogates` of the given ones and whose reason says why
        (keeping any earlier reason after it).
    """
    reason = surrogate_reason("id", doc.id)
    source = escape_surrogates(doc.source)
    if reason is None:
        return doc if source == doc.source else Document(doc.id, doc.text, doc.input_sha256, doc.n_chars, doc.reject_reason, source)
    safe = escape_surrogates(doc.id)
    reason += f"; recorded as {safe!r}"
    if doc.reject_reason:
        reason += f"; the document is also rejected: {doc.reject_reason}"
    return Document(safe, None, doc.input_sha256, 0, reason, source)


def check_bytes(raw: bytes, max_doc_bytes: int, text: str | None = None) -> tuple[str | None, str | None]:
    """Decode one document's bytes or say why it cannot be classified.

    Args:
        raw: the document's raw bytes.
        max_doc_bytes: size limit in bytes.
        text: ``raw`` already decoded, when the caller encoded it from this string (``raw ==
            text.encode("utf-8")``): not decoded again (the result is the same: a leading byte-order mark
            is dropped either way).

    Returns:
        ``(text, None)`` for a usable document, ``(None, reason)`` otherwise.
    """
    if len(raw) == 0:
        return None, "empty document (0 bytes)"
    if len(raw) > max_doc_bytes:
        return None, f"over size limit: {len(raw)} bytes > classify.max_doc_bytes {max_doc_bytes}"
    if (packed := compression_of(raw[:6])) is not None:
        return None, f"compressed document ({packed[0]}): decompress it first ({packed[1]})"
    if (wide := wide_encoding(raw[:4])) is not None:
        return None, f"not UTF-8: the document is {wide[0]}; convert it: iconv -f {wide[1]} -t UTF-8"
    if b"\x00" in raw:
        return None, "binary content: contains NUL bytes (not a text document)"
    if text is not None:
        text = text[1:] if text.startswith("\ufeff") else text  # what decode("utf-8-sig") gives
    else:
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            return None, f"not valid UTF-8: byte 0x{raw[err.start]:02x} at offset {err.start} (re-encode the file as UTF-8)"
    return _check_text(text, len(raw) - len(raw.translate(None, _CONTROL_BYTES)))


def check_text(text: str) -> tuple[str | None, str | None]:
    """Check decoded text: empty, mostly control characters, or with no visible character is rejected.

    Args:
        text: decoded text (see :func:`check_bytes` for the bytes).

    Returns:
        ``(text, None)`` for a usable document, ``(None, reason)`` otherwise; a text of only
        zero-width, format or filler characters (:func:`has_visible_char`) is an empty document.
    """
    return _check_text(text, len(_CONTROL_RE.findall(text)))


def _check_text(text: str, control: int) -> tuple[str | None, str | None]:
    """:func:`check_text` given the count of :data:`_CONTROL_RE` characters in ``text``."""
    if not text or text.isspace():
        return None, "empty document: only whitespace"
    if control / len(text) > CONTROL_SHARE_LIMIT:
        return None, f"binary content: {100 * control / len(text):.0f}% control characters"
    if not has_visible_char(text):
        shown = ", ".join(f"U+{ord(ch):04X}" for ch in dict.fromkeys(text[:200]))
        return None, f"empty document: no visible character ({len(text)} invisible characters: {shown[:120]})"
    return text, None


ORDINARY_SPACE_CHARS = 4
"""A whitespace run of at most this many characters and at most two line breaks is layout, kept as it is
(``"\\r\\n\\r\\n"``, a double space); a longer run is padding (:func:`normalise_text`)."""

_BREAK_RE = re.compile("\r\n|[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
"""Line breaks as :meth:`str.splitlines` counts them (``\\r\\n`` is one)."""
_SPACE_RUN_RE = re.compile(r"\s{2,}")


class Normalised(NamedTuple):
    """A document's text as it is tokenised, and what :func:`normalise_text` dropped from it.

    Attributes:
        text: the text without invisible characters, whitespace padding collapsed, stripped at both ends.
        invisible: invisible characters dropped (format, control, default-ignorable: :func:`invisible_re`).
        padding: whitespace characters dropped from runs longer than layout (:data:`ORDINARY_SPACE_CHARS`
            characters or more than two line breaks), at both ends included; the few characters of an ordinary
            run at an end (a file's last newline) are dropped without being counted.
    """

    text: str
    invisible: int
    padding: int

    def note(self) -> str | None:
        """What was dropped, in words for the result row, or ``None`` when nothing counted was."""
        parts = []
        if self.invisible:
            parts.append(f"{self.invisible} invisible characters (zero-width, format or control)")
        if self.padding:
            parts.append(f"{self.padding} whitespace characters of padding")
        return " and ".join(parts) + " before tokenising" if parts else None


@cache
def invisible_re() -> re.Pattern[str]:
    """The characters that carry no text and are dropped before tokenising, as one compiled character class.

    Every code point of general category Cf (format: zero-width space U+200B, joiners, direction marks, the
    byte-order mark, soft hyphen, tags), Cc (controls) other than whitespace, and the Default_Ignorable_Code_Point
    ranges (:data:`DEFAULT_IGNORABLE_RANGES`: fillers, variation selectors). Built once per process from
    :mod:`unicodedata` (planes 0 and 1; about 0.3 s).
    """
    chars = [cp for cp in range(0x20000)
             if (cat := unicodedata.category(chr(cp))) == "Cf" or (cat == "Cc" and not chr(cp).isspace())]
    chars += [cp for lo, hi in DEFAULT_IGNORABLE_RANGES if lo >= 0x80 for cp in range(lo, hi + 1)]
    ranges: list[list[int]] = []
    for cp in sorted(set(chars)):
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    body = "".join(re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in ranges)
    return re.compile(f"[{body}]+")


_PRINTABLE_IGNORABLES = tuple(chr(cp) for lo, hi in DEFAULT_IGNORABLE_RANGES if hi < 0xE0000 for cp in range(lo, hi + 1)
                              if chr(cp).isprintable())
"""Default-ignorable characters that :meth:`str.isprintable` lets through (variation selectors, fillers): looked for
one by one by :func:`_plain`; those from U+E0000 on are found by their UTF-8 lead bytes."""


def _plain(text: str) -> bool:
    """Whether ``text`` certainly has nothing for :func:`normalise_text` to drop but its ends, found with C-speed string
    methods (about a tenth of the regular expressions' time on news articles): no character :meth:`str.isprintable`
    refuses once newline, CR and tab are spaces (so no format or control character, no other space), no printable
    default-ignorable, and no three whitespace characters in a row (a run that could be more than layout)."""
    probe = text.replace("\n", " ").replace("\r", " ").replace("\t", " ")
    if not probe.isprintable() or "   " in probe:
        return False
    if text.isascii():
        return True
    # U+E0100..U+E01EF (variation selectors supplement) are the printable ignorables past U+FFFF: UTF-8 F3 A0 ...
    return not any(ch in text for ch in _PRINTABLE_IGNORABLES) and b"\xf3\xa0" not in text.encode("utf-8", "surrogatepass")


def _ordinary(run: str) -> bool:
    return len(run) <= ORDINARY_SPACE_CHARS and len(_BREAK_RE.findall(run)) <= 2


def normalise_text(text: str) -> Normalised:
    """Drop what carries no text before a document is tokenised, so padding cannot move its category.

    1. Invisible characters (:func:`invisible_re`: zero-width spaces, other format characters, controls other
       than whitespace, default-ignorable fillers) are removed.
    2. A whitespace run that is more than layout (over :data:`ORDINARY_SPACE_CHARS` characters, or over two line
       breaks) becomes ``"\\n\\n"`` when it held two or more line breaks, ``"\\n"`` for one, ``" "`` for none.
    3. Whitespace at both ends is removed (the prompt template frames the document itself).

    An ordinary text (single spaces, paragraphs split by one blank line, no invisible characters) comes back
    unchanged but for its ends, so its token ids are what they were. Such a text is recognised with string methods
    (:func:`_plain`, a few microseconds for a news article); the others take two regular-expression scans.

    Args:
        text: a decoded document.

    Returns:
        :class:`Normalised`: the text and the characters dropped (``note()`` says it in words).
    """
    if _plain(text):
        return Normalised(text.strip(), 0, 0)
    invisible = 0
    if invisible_re().search(text) is not None:
        shorter = invisible_re().sub("", text)
        invisible, text = len(text) - len(shorter), shorter
    stripped = text.strip()
    head = text[:len(text) - len(text.lstrip())]
    tail = text[len(text.rstrip()):] if stripped else ""
    padding = sum(len(edge) for edge in (head, tail) if not _ordinary(edge))

    def collapse(m: re.Match[str]) -> str:
        nonlocal padding
        run = m.group()
        if _ordinary(run):
            return run
        breaks = len(_BREAK_RE.findall(run))
        kept = "\n\n" if breaks >= 2 else "\n" if breaks else " "
        padding += len(run) - len(kept)
        return kept

    stripped = _SPACE_RUN_RE.sub(collapse, stripped)
    return Normalised(stripped, invisible, padding)
