"""Human sizes: ``parse_size("256M") == 256 << 20``; ``format_size(1 << 20) == "1M"``;
``sizes(8, 64, 2)``: the nccl-tests ``-b -e -f`` sweep."""

from __future__ import annotations

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """Parse ``8``, ``1K``, ``256M``, ``8G`` (powers of 1024; a trailing ``B``/``iB`` is allowed)."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    num, suf = s, ""
    if s and s[-1] in _SUFFIX:
        num, suf = s[:-1], s[-1]
    try:
        value = float(num) * _SUFFIX[suf]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 1K, 256M, 8G)") from None
    if value < 0 or value != int(value):
        raise ValueError(f"not a whole, non-negative number of bytes: {text!r}")
    return int(value)


def format_size(n: int) -> str:
    for suf in ("T", "G", "M", "K"):
        unit = _SUFFIX[suf]
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suf}"
    return str(n)


def sizes(begin: int, end: int, factor: int) -> list[int]:
    """nccl-tests ``-b -e -f``: begin, begin*factor, ... up to end inclusive."""
    if begin < 1 or end < begin:
        raise ValueError(f"need 1 <= minbytes <= maxbytes, got {begin} and {end}")
    if factor < 2:
        raise ValueError(f"stepfactor must be >= 2, got {factor}")
    out, s = [], begin
    while s <= end:
        out.append(s)
        s *= factor
    return out
