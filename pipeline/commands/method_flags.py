"""``fastvocab translate``'s output-layer method flags, made from the methods' options dataclasses
(``kernels/options.py``; every registered method's, ``kernels.registry.options_types``): one flag per
:class:`~fastvocab.kernels.options.Flag` in their fields, shared by the methods that name it alike
(``--candidates``: the k of lsh, graph and shortlist), its help prefixed with those methods' names. So a
flag applies to the methods whose options hold it, and no table says which.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any

from fastvocab.kernels.options import Flag, MethodOptions, flag_of
from fastvocab.pipeline.errors import UserError


def method_flags(types: dict[str, type[MethodOptions]]) -> dict[str, list[tuple[str, Flag]]]:
    """Every flag name -> the (method, flag) pairs that use it, in the methods' and their fields' order."""
    flags: dict[str, list[tuple[str, Flag]]] = {}
    for method, cls in types.items():
        for f in fields(cls):
            flag = flag_of(f)
            if flag is not None:
                flags.setdefault(flag.name, []).append((method, flag))
    return flags


def _default(cls: type[MethodOptions], flag: Flag) -> str | None:
    """What "(default: ...)" says of ``flag`` in ``cls``: the flag's own words, else the field's default."""
    if flag.default is not None:
        return flag.default
    f = next(f for f in fields(cls) if flag_of(f) is flag)
    if f.default is MISSING or f.default is None or isinstance(f.default, bool):
        return None
    return str(f.default)


def _help(users: list[tuple[str, Flag]], types: dict[str, type[MethodOptions]]) -> str:
    defaults = [(m, _default(types[m], flag)) for m, flag in users]
    if all(flag == users[0][1] for _, flag in users):
        text = f"{', '.join(m for m, _ in users)}: {users[0][1].help}"
        said = {d for _, d in defaults}
        default = defaults[0][1] if len(said) == 1 else ", ".join(f"{m} {d}" for m, d in defaults if d)
    else:
        text = "; ".join(f"{m}: {flag.help}" for m, flag in users)
        default = ", ".join(f"{m} {d}" for m, d in defaults if d)
    return f"{text} (default: {default})" if default else text


def add_method_flags(p: argparse._ActionsContainer, types: dict[str, type[MethodOptions]]) -> None:
    """One flag for each option of ``types``' dataclasses, its value None where not given (so that a flag of
    another method than the one chosen is refused, :func:`chosen_options`)."""
    for name, users in method_flags(types).items():
        flag = users[0][1]
        kwargs: dict[str, Any] = {"default": None, "help": _help(users, types)}
        if flag.type is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=flag.type, metavar=flag.metavar, choices=flag.choices)
        p.add_argument(name, dest=flag.dest, **kwargs)


def applies_to(names: list[str], methods: list[str], method: str) -> UserError:
    """The error for flags given with a method they do not apply to (``methods``: those they apply to)."""
    verb = "applies" if len(names) == 1 else "apply"
    return UserError(
        f"{' and '.join(names)} {verb} to --method {' or '.join(methods)}, not --method {method}"
    )


def given_flags(args: argparse.Namespace, types: dict[str, type[MethodOptions]], method: str) -> set[str]:
    """The method flags given on the command line (``types``' flags whose value is not None); flags of
    another method than ``method`` are a UserError naming them and the methods they apply to."""
    given: set[str] = set()
    foreign: dict[tuple[str, ...], list[str]] = {}
    for name, users in method_flags(types).items():
        if getattr(args, users[0][1].dest, None) is None:
            continue
        methods = tuple(m for m, _ in users)
        if method not in methods:
            foreign.setdefault(methods, []).append(name)
        given.add(name)
    if foreign:
        methods, names = next(iter(foreign.items()))
        raise applies_to(names, list(methods), method)
    return given


def chosen_options(
    args: argparse.Namespace, types: dict[str, type[MethodOptions]], method: str, **values: object
) -> MethodOptions:
    """``method``'s options from the flags given, ``values`` (the folders found for the artifact flags, the
    direction) taking their place; a flag of another method, a missing artifact or a value the options
    refuse is a one-line UserError that names the flag."""
    given_flags(args, types, method)
    cls = types[method]
    chosen: dict[str, object] = {}
    for f in fields(cls):
        flag = flag_of(f)
        value = values.get(f.name, None if flag is None else getattr(args, flag.dest, None))
        if value is not None:
            chosen[f.name] = value
        elif f.default is MISSING and flag is not None:
            hint = f" ({flag.needed})" if flag.needed else ""
            raise UserError(f"--method {method} needs {flag.name}{hint}")
    try:
        return cls(**chosen)
    except ValueError as exc:
        raise UserError(_flag_named(str(exc), cls)) from exc


def _flag_named(message: str, cls: type[MethodOptions]) -> str:
    """A refusal that names an option by its field (``k must be ...``) named by its flag instead."""
    for f in fields(cls):
        flag = flag_of(f)
        if flag is not None and message.startswith(f"{f.name} "):
            return flag.name + message[len(f.name) :]
    return message
