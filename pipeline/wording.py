"""Wording shared by the command lines' summaries."""


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, the noun plural unless ``n`` is 1: ``plural(3, "line")`` is ``"3 lines"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
