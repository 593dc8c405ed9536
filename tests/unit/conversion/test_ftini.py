"""config.ini: one vocabulary (ftx_triton.conversion.ftini.KEYS), one writer, one reader, families as data.

Every family's config.ini, written and read back, equals the snapshot taken from the families'
hand-written writers and readers before they were replaced (``tests/ftini_snapshot.json``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from ftini_cases import CASES, UPSTREAM, family_of, hf_config_of, snapshot, upstream_ini_text
from ftx_triton.conversion.family import Family, ModelSpec
from ftx_triton.conversion.ftini import (
    KEYS,
    FtIni,
    IniSection,
    Key,
    config_sections,
    hf_config_from_ini,
    read_quantities,
)
from ftx_triton.errors import CheckpointError, PluginError
from ftx_triton.formats.ftformat import read_ini, write_ini

SNAP = snapshot()

NEW_IN_THE_READER = {"gpt2": {"architectures": ["GPT2LMHeadModel"]}}
"""Fields the one reader adds that a hand-written one left out: the template's ``hf_model_class``."""


def ini_file(tmp_path: Path, text: str) -> dict[str, dict[str, str]]:
    path = tmp_path / "config.ini"
    path.write_text(text)
    return read_ini(path)


# -- every family: identical to the hand-written writers and readers -------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_config_ini_equals_the_snapshot(case, tmp_path: Path) -> None:
    family = family_of(case.family)
    assert "config_ini" not in type(family).__dict__ and "hf_config_from_ini" not in type(family).__dict__
    hf_config = hf_config_of(case, family)
    path = tmp_path / "config.ini"
    write_ini(path, family.config_ini(family.spec(hf_config), hf_config, case.weight_dtype))
    assert path.read_text() == SNAP["ftx"][case.id]["config_ini"]
    expected = {**SNAP["ftx"][case.id]["hf_config"], **NEW_IN_THE_READER.get(case.family, {})}
    assert family.hf_config_from_ini(read_ini(path)) == expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_config_ini_round_trips_to_the_same_spec(case, tmp_path: Path) -> None:
    family = family_of(case.family)
    spec = family.spec(hf_config_of(case, family))
    text = SNAP["ftx"][case.id]["config_ini"]
    expected = spec.as_dict()
    if "pad_token_id" not in text:
        expected["pad_id"] = None  # GPT-style sections carry no pad id (FT takes it per request)
    assert family.spec_from_ini(ini_file(tmp_path, text)).as_dict() == expected


@pytest.mark.parametrize("case", sorted(UPSTREAM))
def test_upstream_config_ini_reads_like_the_snapshot(case: str, tmp_path: Path) -> None:
    family = family_of(UPSTREAM[case])
    assert family.hf_config_from_ini(ini_file(tmp_path, upstream_ini_text(case))) == SNAP["upstream"][case]


# -- the reader on bad or unusual files ------------------------------------------------------------------------


GPTJ_INI = SNAP["ftx"]["gptj-golden-fp32"]["config_ini"]


def test_a_missing_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no \[gptj\] section \(it has gptneox\)") as caught:
        family_of("gptj").hf_config_from_ini(ini_file(tmp_path, GPTJ_INI.replace("[gptj]", "[gptneox]")))
    assert "--family gptj" in (caught.value.hint or "")


def test_a_missing_key_is_named(tmp_path: Path) -> None:
    text = "\n".join(line for line in GPTJ_INI.splitlines() if not line.startswith(("head_num", "end_id")))
    with pytest.raises(CheckpointError, match=r"no \[gptj\] head_num, \[gptj\] end_id"):
        family_of("gptj").hf_config_from_ini(ini_file(tmp_path, text))


def test_a_value_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    text = GPTJ_INI.replace("rotary_embedding = 8", "rotary_embedding = None")  # upstream's null rotary_dim
    with pytest.raises(CheckpointError, match=r"\[gptj\] rotary_embedding = 'None' is not an integer"):
        family_of("gptj").hf_config_from_ini(ini_file(tmp_path, text))


def test_sections_that_disagree_are_refused(tmp_path: Path) -> None:
    text = SNAP["ftx"]["t5-golden-v1_0"]["config_ini"]
    decoder = text.index("[decoder]")
    changed = text[:decoder] + text[decoder:].replace("d_model = 64", "d_model = 32", 1)
    with pytest.raises(CheckpointError, match=r"\[encoder\] d_model = 64 but \[decoder\] d_model = 32"):
        family_of("t5").hf_config_from_ini(ini_file(tmp_path, changed))
    gated = text.replace("use_gated_activation = false", "use_gated_activation = true")
    with pytest.raises(CheckpointError, match=r"is_gated_act = False but \[structure\] use_gated_activation = True"):
        family_of("t5").hf_config_from_ini(ini_file(tmp_path, gated))


def test_optional_keys_and_sections_take_their_defaults(tmp_path: Path) -> None:
    text = SNAP["ftx"]["gptneox-sequential-full-rotary-fp32"]["config_ini"]
    lean = "\n".join(line for line in text.splitlines() if not line.startswith(("use_gptj_residual", "hidden_act")))
    config = family_of("gptneox").hf_config_from_ini(ini_file(tmp_path, lean))
    assert config["use_parallel_residual"] is True  # FT's default when the key is absent
    assert "hidden_act" not in config  # unknown: transformers' default applies
    t5 = SNAP["ftx"]["t5-golden-v1_1-fp16"]["config_ini"]
    without_structure = t5[: t5.index("[structure]")].replace("tie_word_embeddings = true\n", "")
    config = family_of("t5").hf_config_from_ini(ini_file(tmp_path, without_structure))
    assert config["feed_forward_proj"] == "gated-gelu" and config["tie_word_embeddings"] is True


def test_booleans_read_like_fasterTransformer(tmp_path: Path) -> None:
    """GetBoolean: true/yes/on/1, false/no/off/0, anything else is the key's default."""
    t5 = SNAP["ftx"]["t5-golden-v1_0"]["config_ini"]
    for text, tied in (("no", False), ("On", True), ("True", True), ("maybe", True)):
        config = family_of("t5").hf_config_from_ini(
            ini_file(tmp_path, t5.replace("tie_word_embeddings = true", f"tie_word_embeddings = {text}"))
        )
        assert config["tie_word_embeddings"] is tied, text
    upstream_gated = (
        t5.replace("feed_forward_proj = relu", "feed_forward_proj = gelu")
        .replace("is_gated_act = false", "is_gated_act = True")
        .replace("use_gated_activation = false", "use_gated_activation = 1")
    )
    assert family_of("t5").hf_config_from_ini(ini_file(tmp_path, upstream_gated))["feed_forward_proj"] == "gated-gelu"


# -- declarations and the writer -------------------------------------------------------------------------------


def toy_family(ini: FtIni, **extra: Any) -> Family:
    attrs = {"name": "toy", "ini": ini, "triton_model_type": "GPT", "hf_model_class": "", **extra}
    return type("Toy", (Family,), attrs)()


TOY_SPEC = ModelSpec(dims={"N": 2, "D": 8}, layers={"i": 3}, start_id=1, end_id=2, extra={"flag": 1})


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: IniSection("x", ("head_num", "nope")), "unknown key 'nope'"),
        (lambda: IniSection("x", ("head_num", "head_num")), "lists a key twice"),
        (lambda: IniSection("x", ("model_type",)), r"\[x\] model_type has no source"),
        (lambda: IniSection("x", ("head_num",), values={"d_kv": 1}), r"name keys it does not list: \['d_kv'\]"),
        (lambda: Key("ids", list, "a list", "ids"), "type must be int, float, str or bool"),
    ],
)
def test_bad_declarations_fail_when_the_plugin_is_imported(make, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        make()


def test_the_writer_refuses_a_spec_of_the_wrong_type() -> None:
    flag = Key("flag", int, "a toy flag", "flag")
    family = toy_family(FtIni(sections=(IniSection("toy", ("head_num", flag)),)))
    assert config_sections(family, TOY_SPEC, {}, "fp32") == {"toy": {"head_num": 2, "flag": 1}}
    with pytest.raises(PluginError, match=r"\[toy\] flag needs an integer, but quantity 'flag' is True"):
        config_sections(family, replace(TOY_SPEC, extra={"flag": True}), {}, "fp32")
    with pytest.raises(PluginError, match=r"\[toy\] head_num needs an integer, but quantity 'N' is None"):
        config_sections(family, replace(TOY_SPEC, dims={"D": 8}), {}, "fp32")


def test_a_family_without_sections_cannot_write_config_ini() -> None:
    with pytest.raises(PluginError, match="family toy declares no config.ini sections"):
        toy_family(FtIni(sections=())).config_ini(TOY_SPEC, {}, "fp32")


def test_the_reader_derives_the_hidden_size_and_a_required_boolean(tmp_path: Path) -> None:
    strict = Key("strict", bool, "a toy boolean without a default", "strict")
    family = toy_family(
        FtIni(
            sections=(IniSection("toy", ("head_num", "size_per_head", strict)),),
            hf_fields={"hidden": "H", "strict": "strict"},
        )
    )
    assert read_quantities(family, ini_file(tmp_path, "[toy]\nhead_num = 2\nsize_per_head = 8\nstrict = yes\n")) == {
        "N": 2,
        "D": 8,
        "H": 16,
        "strict": True,
        "name": "toy",
    }
    with pytest.raises(CheckpointError, match=r"\[toy\] strict = 'maybe' is not a boolean"):
        hf_config_from_ini(family, ini_file(tmp_path, "[toy]\nhead_num = 2\nsize_per_head = 8\nstrict = maybe\n"))


def test_the_vocabulary_is_defined_once() -> None:
    assert all(name == key.name for name, key in KEYS.items())
    for family in ("gptj", "gptneox", "t5", "gpt2"):
        for section in family_of(family).ini.sections:
            canonical = [k for k in section.keys if isinstance(k, str)]
            assert all(name in KEYS for name in canonical)


# -- the fingerprint covers the declaration --------------------------------------------------------------------


def test_the_fingerprint_follows_the_ini_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    from ftx_gptj.family import GPTJ
    from ftx_gptneox.family import GPTNeoX

    before = GPTJ().fingerprint()
    assert GPTJ().fingerprint() == before
    ini = GPTJ.ini
    section = ini.sections[0]
    changes = [
        replace(ini, sections=(replace(section, keys=section.keys[::-1]),)),  # key order
        replace(ini, hf_constants={**ini.hf_constants, "layer_norm_epsilon": 1e-6}),
        replace(ini, model_name="gpt-j"),
        replace(ini, sections=(replace(section, keys=(*section.keys, Key("extra", int, "x", "V"))),)),
    ]
    for changed in changes:
        monkeypatch.setattr(GPTJ, "ini", changed)
        assert GPTJ().fingerprint() != before
    monkeypatch.setattr(GPTJ, "ini", ini)
    neox = GPTNeoX().fingerprint()
    fields = dict(GPTNeoX.ini.hf_fields)
    fields["rotary_pct"] = lambda q: q["rotary_embedding"] / q["D"] / 2  # same name, other code
    monkeypatch.setattr(GPTNeoX, "ini", replace(GPTNeoX.ini, hf_fields=fields))
    assert GPTNeoX().fingerprint() != neox


def test_the_fingerprint_reads_each_functions_source_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage key of a run asks for the fingerprint (six times a cached run): the converter functions' source
    is read once a process, and the digest is the same as reading it each time."""
    import inspect

    from ftx_gptj.family import GPTJ
    from ftx_triton.conversion import family as family_module

    reads: list[object] = []
    real = inspect.getsource
    family_module._remembered_source.cache_clear()
    monkeypatch.setattr(inspect, "getsource", lambda obj: reads.append(obj) or real(obj))
    first = GPTJ().fingerprint()
    once = len(reads)
    assert once > 10 and GPTJ().fingerprint() == first and len(reads) == once
    family_module._remembered_source.cache_clear()
    assert GPTJ().fingerprint() == first  # read afresh: the same digest
