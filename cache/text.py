"""Text from the database, made safe to print.

Anyone who can write the cache can store any string in a name, a key or a message, terminal
escape sequences included; whatever prints stored text to a terminal or a log passes it
through ``escape_control`` first.
"""

from __future__ import annotations

import unicodedata

# Control characters (C0, DEL, C1) and format characters (bidirectional overrides among them),
# which reorder or restyle what follows them on a terminal.
_UNSAFE = ("Cc", "Cf")


def escape_control(text: str) -> str:
    """``text`` with every control and format character written as its Python escape (``\\x1b``)."""
    if text.isprintable():
        return text
    return "".join(_escaped(ch) if unicodedata.category(ch) in _UNSAFE else ch for ch in text)


def _escaped(ch: str) -> str:
    return ch.encode("unicode_escape").decode("ascii")
