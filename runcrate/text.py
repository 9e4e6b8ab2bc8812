"""What no text input may hold, wherever it arrives: an API body or query string, a form, a URL,
the inventory file.

PostgreSQL stores no NUL (U+0000) in a text column or in jsonb, and a lone surrogate (JSON's
"\\ud800") cannot be encoded to UTF-8 at all: either one reaching a query was a 500, not a
refusal. The other control characters mean nothing in a name, an id, a note or a GPU's name;
text that spans lines (a quote's notes, nvidia-smi's CSV) keeps tab, line feed and carriage
return, and a path or a query string has no line at all to break.
"""

import math
import re
from typing import Any

from runcrate.errors import Refused

# A JSON document nests objects and lists at most this deep: every document the product reads
# (a request body, an inventory) needs a handful of levels, and a deeper one only costs stack.
MAX_DEPTH = 32

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
_CONTROL_ON_ONE_LINE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


class InvalidText(Refused):
    """Text holding a character no input may hold, a number JSON cannot carry, or a JSON
    document nested deeper than MAX_DEPTH."""

    def __init__(self, code: str, message: str, *, field: str | None = None) -> None:
        super().__init__(code, message, field=field, status=422)


def refused_character(text: str, *, one_line: bool = False) -> str | None:
    """The first character of `text` that no input may hold, described for a person, or None.
    With `one_line`, tab and line breaks are refused too (a path, a query string)."""
    found = (_CONTROL_ON_ONE_LINE if one_line else _CONTROL).search(text)
    if found is None:
        return None
    code = ord(found.group())
    kind = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "the control character"
    return f"{kind} U+{code:04X}"


def check_text(text: str, *, where: str, one_line: bool = False) -> None:
    """Raise InvalidText (`invalid_text`) when `text` holds a refused character."""
    problem = refused_character(text, one_line=one_line)
    if problem is not None:
        raise InvalidText(
            "invalid_text",
            f"{where} holds {problem}: text may hold no control characters (tab and line "
            "breaks aside, where text spans lines) and no lone surrogates.",
            field=where,
        )


def check_json(data: Any, *, name: str = "the body", max_depth: int = MAX_DEPTH) -> None:
    """Raise InvalidText when a string of the parsed JSON `data` (a key or a value) holds a
    refused character (`invalid_text`), a number is beyond what a float holds (`1e400` reads as
    infinity: `invalid_number`) or it nests deeper than `max_depth` (`too_deep`). Messages name
    the place (`gpus[0].name`), or `name` for the document itself.

    Walked with a stack, not recursion, so that no document exhausts Python's stack here."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        where = path or name
        if isinstance(value, str):
            check_text(value, where=where)
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidText(
                "invalid_number", f"{where} is beyond the numbers JSON can carry.", field=path
            )
        elif isinstance(value, dict | list):
            if depth >= max_depth:
                raise too_deep(name=name, max_depth=max_depth)
            if isinstance(value, list):
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
                continue
            for key, item in value.items():
                check_text(str(key), where=f"a key of {where}")
                stack.append((item, f"{path}.{key}" if path else str(key), depth + 1))


def too_deep(*, name: str, max_depth: int = MAX_DEPTH) -> InvalidText:
    """The refusal of a document nested deeper than `max_depth`, also of one so deep that the
    JSON parser itself ran out of stack (RecursionError)."""
    return InvalidText(
        "too_deep", f"{name} nests objects and lists more than {max_depth} levels deep."
    )


# --- text from a host, shown -------------------------------------------------------------------

# How a control character a host printed is shown (a log on the page, its download): the C0
# controls and DEL as their Unicode control pictures (ESC as ␛, CR as ␍, NUL as ␀), the C1
# controls (no pictures) and the bidirectional controls (which reorder what follows) as `\xNN` /
# `\uNNNN`. Line feed and tab stay: they are the text's layout, and move no terminal's cursor
# anywhere it would not go for plain text.
_VISIBLE: dict[int, str] = {
    **{code: chr(0x2400 + code) for code in range(0x20) if chr(code) not in "\n\t"},
    0x7F: "\u2421",
    **{code: f"\\x{code:02x}" for code in range(0x80, 0xA0)},
    **{
        code: f"\\u{code:04x}"
        for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
    },
}


def visible_controls(text: str) -> str:
    """`text` with every control character but line feed and tab made visible (_VISIBLE): a
    host's output shown or downloaded replays no escape sequence in a browser's copy or a
    terminal's `cat`."""
    return text.translate(_VISIBLE)
