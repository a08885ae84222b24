"""Text from a bundle, written into another format (Dockerfile, YAML, Triton pbtxt, Markdown), stays data.

Two layers: :func:`check_text` refuses a manifest string holding a control character, a line or paragraph
separator, a format character (bidi overrides) or a lone surrogate, naming the field; and every writer still
escapes what it writes (:func:`one_line` for comments, :func:`md_code` for Markdown), so a string that slipped past
the check cannot start a new line or instruction.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from edgesdk.errors import BundleError

REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
MAX_TEXT_CHARS = 256


def check_text(value: Any, field: str) -> str:
    """``value`` if it is one line of printable text; :class:`BundleError` naming ``field`` otherwise."""
    if not isinstance(value, str):
        raise BundleError(f"manifest field {field} must be a string; got {type(value).__name__}")
    if not value or len(value) > MAX_TEXT_CHARS:
        raise BundleError(f"manifest field {field} must hold 1 to {MAX_TEXT_CHARS} characters; got {len(value)}")
    for i, char in enumerate(value):
        if unicodedata.category(char) in REFUSED_CATEGORIES:
            raise BundleError(f"manifest field {field} holds the control character U+{ord(char):04X} at position "
                              f"{i}; names, versions and ids are one line of printable text")
    return value


def one_line(value: Any) -> str:
    """``value`` as text for a comment or a heading: every refused character written as a ``\\uXXXX`` escape."""
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in REFUSED_CATEGORIES else c for c in str(value))


def md_code(value: Any) -> str:
    """``value`` as a Markdown code span: fenced by more backticks than it holds in a row (CommonMark)."""
    text = one_line(value)
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
