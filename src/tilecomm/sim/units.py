"""Sizes as people type them: ``8``, ``1K``, ``256M``, ``8G`` (powers of 1024)."""

from __future__ import annotations

_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes in ``text``; a trailing ``B`` or ``iB`` is accepted (``"1KiB" == 1024``)."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    num, unit = (s[:-1], s[-1]) if s and s[-1] in _UNIT else (s, "")
    try:
        value = float(num) * _UNIT[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 1K, 256M, 8G)") from None
    if value < 0 or value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def format_size(n: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if n >= _UNIT[unit] and n % _UNIT[unit] == 0:
            return f"{n // _UNIT[unit]}{unit}"
    return str(n)


def sizes(begin: int, end: int, factor: int) -> list[int]:
    """nccl-tests ``-b -e -f``: begin, begin*factor, ... up to end inclusive."""
    if factor < 2:
        raise ValueError("factor must be >= 2")
    out, s = [], max(1, begin)
    while s <= end:
        out.append(s)
        s *= factor
    return out
