"""The translation catalogs (locale/*/LC_MESSAGES/): every string the sources mark is translated,
with the same placeholders and markup, and the committed .mo files (what Django reads; a fresh
clone needs no GNU gettext) say exactly what their .po files say."""

from __future__ import annotations

import gettext
import re
import shutil
from pathlib import Path

import pytest

from scripts import messages

CATALOGS = sorted(messages.LOCALE_DIR.glob("*/LC_MESSAGES/*.po"))
PLACEHOLDER = re.compile(r"%\(\w+\)[sdr]")
TAG = re.compile(r"</?\w+>")


def test_there_is_a_catalog_per_domain_for_chinese() -> None:
    assert {path.relative_to(messages.LOCALE_DIR).as_posix() for path in CATALOGS} == {
        "zh_Hans/LC_MESSAGES/django.po",
        "zh_Hans/LC_MESSAGES/djangojs.po",
    }


def test_a_fuzzy_flag_belongs_to_the_entry_under_it(tmp_path: Path) -> None:
    po = tmp_path / "django.po"
    po.write_text('msgid ""\nmsgstr ""\n\nmsgid "a"\nmsgstr "A"\n\n#, fuzzy\n#| msgid "old"\nmsgid "b"\nmsgstr "B"\n')
    assert [entry["flags"].strip() for entry in messages.po_entries(po)] == ["", "", "fuzzy"]
    assert messages.read_po(po) == {"a": "A"}
    assert messages.marked_keys(po) == ["a", "b"]  # what the sources mark, a changed string's fuzzy guess too


@pytest.mark.parametrize("po", CATALOGS, ids=lambda p: p.name)
def test_the_compiled_catalog_says_what_its_source_says(po: Path) -> None:
    with open(po.with_suffix(".mo"), "rb") as mo_file:
        compiled = gettext.GNUTranslations(mo_file)._catalog  # {msgid or (msgid, n) or "ctx\x04msgid": str}
    compiled = {
        (key[0] if isinstance(key, tuple) else key): value
        for key, value in compiled.items()
        if key != "" and (not isinstance(key, tuple) or key[1] == 0)
    }
    assert compiled == messages.read_po(po), f"{po.with_suffix('.mo')} is stale: run `make messages`"


@pytest.mark.parametrize("po", CATALOGS, ids=lambda p: p.name)
def test_every_entry_is_translated_with_its_placeholders_and_markup(po: Path) -> None:
    entries = [entry for entry in messages.po_entries(po) if entry["msgid"]]
    assert len(entries) > 300
    for entry in entries:
        msgid, translation = entry["msgid"], entry.get("msgstr", entry.get("msgstr[0]", ""))
        assert translation, f"untranslated: {msgid!r}"
        assert "fuzzy" not in entry["flags"], msgid
        # a plural entry's one Chinese form may name the count its English singular leaves out
        source = msgid + entry.get("msgid_plural", "")
        assert sorted(set(PLACEHOLDER.findall(translation))) == sorted(set(PLACEHOLDER.findall(source))), msgid
        assert sorted(TAG.findall(translation)) == sorted(TAG.findall(msgid)), msgid


def test_technical_terms_keep_their_usual_forms() -> None:
    """The lesson's own vocabulary: KV Cache, Prefill, Decode, top-k and token stay as they are."""
    django = messages.read_po(messages.LOCALE_DIR / "zh_Hans/LC_MESSAGES/django.po")
    javascript = messages.read_po(messages.LOCALE_DIR / "zh_Hans/LC_MESSAGES/djangojs.po")
    assert django["Inference optimization: the KV Cache"] == "推理优化：KV Cache"
    assert django["Two phases: Prefill vs Decode"] == "推理阶段划分：Prefill vs Decode"
    assert javascript["phase\x04prefill"] == "Prefill" and javascript["phase\x04decode"] == "Decode"
    assert "top-k" in javascript["%(n)s more than k: they tie with the k-th score, and top-k keeps ties"]
    assert "token" in javascript["%(n)s tokens"]
    for catalog in (django, javascript):
        for translation in catalog.values():
            assert "键值缓存" not in translation and "预填充阶段" not in translation


@pytest.mark.skipif(shutil.which("xgettext") is None, reason="needs GNU gettext (Debian: apt-get install gettext)")
def test_the_catalogs_list_every_string_the_sources_mark() -> None:
    """Django's own extraction over a copy of the sources finds nothing the catalogs lack (.ci/run
    installs gettext, so CI runs this)."""
    assert messages.missing_strings() == {}
