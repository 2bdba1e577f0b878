"""Each method's options dataclass is the one declaration of its options: ``fastvocab translate``'s method
flags are made from its fields, the pipeline config's translate keys are its fields, and each rule is checked
by the dataclass, whose refusal the command line and the config say in one line."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from fastvocab.kernels.clustered_parts import ClusteredOptions
from fastvocab.kernels.options import flag_of
from fastvocab.kernels.registry import available_projections, build_projection, options_types
from fastvocab.pipeline.cli import build_parser
from fastvocab.pipeline.commands.method_flags import chosen_options
from fastvocab.pipeline.config import TranslateConfig, load_config
from fastvocab.pipeline.errors import UserError

ARGV = ["translate", "--src-lang", "en", "--tgt-lang", "it", "-i", "x", "-o", "y"]
# a value for each option a flag sets, by flag type: (on the command line, in the options)
VALUES = {int: ("2", 2), Path: ("/some/dir", Path("/some/dir")), bool: (None, True)}


def _parse(*flags: str):
    return build_parser("translate").parse_args([*ARGV, *flags])


def _flag_fields():
    for method, cls in options_types().items():
        for f in fields(cls):
            if flag_of(f) is not None:
                yield method, cls, f


def _required(f) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def test_the_method_flags_are_the_option_fields_flags():
    """The method group of ``fastvocab translate`` holds ``--method``, ``--no-shortlist`` (which tables the
    CLI looks for, not an option) and one flag per options field, nothing written by hand besides."""
    types = options_types()
    assert list(types) == available_projections() == ["clustered", "full", "graph", "lsh", "shortlist"]
    assert all(cls.method == name for name, cls in types.items())
    parser = build_parser("translate")._subparsers._group_actions[0].choices["translate"]
    (group,) = [g for g in parser._action_groups if g.title == "the output-layer method and its options"]
    flags = {a.option_strings[0]: a for a in group._group_actions}
    wanted = {flag_of(f).name for _, _, f in _flag_fields()}
    assert set(flags) == wanted | {"--method", "--no-shortlist"}
    assert all(flags[name].default is None for name in wanted)  # given or not: a flag of another method


@pytest.mark.parametrize(("method", "name"), [(m, f.name) for m, _, f in _flag_fields()])
def test_each_flag_lands_in_its_field(method, name):
    """A flag given on the command line is that field's value in the options the job receives."""
    cls = options_types()[method]
    f = next(f for f in fields(cls) if f.name == name)
    flag = flag_of(f)
    text, value = VALUES.get(flag.type, (None, None))
    if flag.choices:
        text = value = flag.choices[-1]
    args = _parse("--method", method, flag.name, *([] if text is None else [text]))
    # the folders of the other artifact options, as the command line finds them, and a table's direction
    found: dict[str, object] = {g.name: "/a/map" for g in fields(cls) if _required(g) and g.name != name}
    if method == "shortlist":
        found["direction"] = "en-it"
    assert getattr(chosen_options(args, options_types(), method, **found), name) == value


def test_a_flag_of_another_method_and_a_missing_artifact_are_one_line_errors():
    with pytest.raises(UserError, match="--probes applies to --method clustered, not --method lsh"):
        chosen_options(_parse("--method", "lsh", "--probes", "2"), options_types(), "lsh")
    with pytest.raises(UserError, match="--bits applies to --method lsh, not --method graph"):
        chosen_options(_parse("--method", "graph", "--bits", "8"), options_types(), "graph")
    with pytest.raises(UserError, match=r"--method shortlist needs --index \(a shortlist table"):
        chosen_options(_parse("--method", "shortlist"), options_types(), "shortlist")
    # the dataclass's refusal, named by the flag the user typed
    with pytest.raises(UserError, match="--candidates must be an integer >= 1, got 0"):
        chosen_options(_parse("--method", "lsh", "--candidates", "0"), options_types(), "lsh")


def test_the_translate_section_holds_the_clustered_options_fields():
    """Every user-facing field of ClusteredOptions but the map (the run's own, or eval.maps) is a key of the
    translate section, with the same default; the section's options are the dataclass's."""
    keys = {f.name for f in fields(ClusteredOptions)} - {"cluster_map"}
    config = TranslateConfig()
    assert keys <= set(TranslateConfig.model_fields)
    for name in keys - {"shortlist"}:  # the section's shortlist is a folder of tables, found per direction
        assert getattr(config, name) == getattr(ClusteredOptions, name), name
    assert config.clustered("m") == ClusteredOptions("m")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"translate.probes": 2, "translate.selection": "per-row"}, "probes > 1 needs union selection"),
        ({"translate.probes": 0}, "probes must be an integer >= 1, got 0"),
        ({"translate.shortlist": "t", "translate.selection": "per-row"}, "it needs union selection"),
    ],
)
def test_the_config_refuses_what_the_options_refuse(overrides, message):
    with pytest.raises(UserError, match=message) as exc:
        load_config(None, overrides)
    assert "\n" not in str(exc.value)


def test_the_rule_lives_in_the_options_and_the_kernel_reads_the_same_object():
    with pytest.raises(ValueError, match="probes > 1 needs union selection"):
        ClusteredOptions("m", selection="per-row", probes=2)
    kwargs = ClusteredOptions("m", probes=3, exact=True).projection_kwargs(beam=4, int8=True)
    assert kwargs == {
        "cluster_map": "m",
        "selection": "union",
        "inactive_mass": "normaliser",
        "exact_k": 8,
        "probes": 3,
        "int8": True,
    }
    import torch

    from fastvocab.kernels.full import FullOptions
    from fastvocab.kernels.lsh import LshOptions

    w = torch.randn(16, 4)
    assert build_projection(FullOptions(), w, None).name == "full"
    with pytest.raises(ValueError, match="are not the options of method"):
        build_projection(type("Fake", (LshOptions,), {"method": "full"})(), w, None)


def test_the_search_flags_and_keys_are_the_search_settings_fields():
    """The search options too are one declaration, ``SearchSettings``, whose fields the config's translate
    keys and the command line's flags are named after (with its defaults)."""
    from fastvocab.decoding.settings import SearchSettings

    config = TranslateConfig()
    args = _parse()
    for f in fields(SearchSettings):
        assert getattr(config, f.name) == f.default, f.name
        assert getattr(args, f.name) == f.default, f.name
    assert config.search() == SearchSettings()
