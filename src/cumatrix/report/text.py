"""Make child output safe to show: strip terminal escapes, escape for Markdown/HTML/XML.

Cell output is whatever a crashing binary wrote; every report treats it as untrusted text.
"""

from __future__ import annotations

import html
import re

# CSI (``ESC [ ... final``), OSC (``ESC ] ... BEL|ST``) and two-byte escapes.
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")
# XML 1.0 allows only tab, newline, carriage return below 0x20, and no U+FFFE/U+FFFF; the C1
# controls (U+0080-U+009F: CSI, OSC, DCS in 8-bit form, which some terminals obey) go too.
_XML_BAD_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff\ud800-\udfff]")
_BACKTICKS_RE = re.compile("`+")
# Markdown metacharacters that act mid-line (text is never put at the start of a line).
_MD_META_RE = re.compile(r"([\\`*_\[\]|~])")


def strip_ansi(text: str) -> str:
    """Remove terminal colour and cursor escapes."""
    return _ANSI_RE.sub("", text)


def clean(text: str) -> str:
    """Strip ANSI escapes and show other control characters as ``\\xNN``.

    Keeps tab and newline; a bare carriage return becomes a newline.
    """
    text = strip_ansi(text).replace("\r\n", "\n").replace("\r", "\n")
    return _XML_BAD_RE.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


def md_inline(text: str) -> str:
    """Escape text for one line of Markdown, table cells included (``|`` too).

    HTML metacharacters become entities (GitHub renders raw HTML); newlines become spaces.
    """
    text = clean(text).replace("\n", " ").replace("\t", " ")
    text = html.escape(text, quote=False)  # & < > first: the escapes below add no & or <
    return _MD_META_RE.sub(r"\\\1", text)


def md_fenced(text: str, indent: str = "") -> list[str]:
    """Lines of a fenced code block holding ``text`` that no line of it can close: the fence is
    one backtick longer than the longest run of backticks in it (at least three).  Everything
    inside is shown as it is: links, images, headings and HTML are not rendered there.
    ``indent`` goes before every line (a block inside a list item)."""
    body = clean(text)
    longest = max((len(m) for m in _BACKTICKS_RE.findall(body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{indent}{fence}text", *(f"{indent}{line}" for line in body.split("\n")), f"{indent}{fence}"]


def md_code(text: str) -> str:
    """Text for a ``<code>`` element inside Markdown (no backslash escapes apply there)."""
    text = clean(text).replace("\n", " ")
    return "<code>" + html.escape(text).replace("|", "&#124;") + "</code>"


def shorten(text: str, limit: int) -> str:
    """The last ``limit`` characters of text (tails matter most), marked when cut."""
    if len(text) <= limit:
        return text
    return "…" + text[-limit:]
