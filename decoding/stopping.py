"""Beam search's stopping rules (``early_stopping``, as ``generate`` reads it): their command-line names,
the check of a rule, and the rule a search runs (the one asked for, else the model's generation config's)."""

from __future__ import annotations

# Command-line names of beam search's stopping rules (``early_stopping``); "model": the generation config's.
EARLY_STOPPING_RULES: dict[str, bool | str | None] = {
    "model": None,
    "true": True,
    "false": False,
    "never": "never",
}


def parse_early_stopping(text: str) -> bool | str | None:
    """``"true"`` -> True, ``"never"`` -> "never", ``"model"`` -> None, ...; ValueError naming the choices."""
    try:
        return EARLY_STOPPING_RULES[text.lower()]
    except KeyError:
        raise ValueError(f"{text!r}: choose from {', '.join(EARLY_STOPPING_RULES)}") from None


def check_stopping_rule(rule: object) -> None:
    """ValueError unless ``rule`` is one of beam search's stopping rules: True, False or "never"."""
    if rule not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {rule!r}")


def stopping_rule(adapter, early_stopping: bool | str | None = None) -> bool | str:
    """``early_stopping`` checked, or when None the model's generation config's rule, as ``generate``
    reads it (``adapter.early_stopping``)."""
    rule = getattr(adapter, "early_stopping", False) if early_stopping is None else early_stopping
    check_stopping_rule(rule)
    return rule
