"""`make messages`: refresh the translation catalogs after UI strings change, then compile them.

Owns: how the catalogs are extracted (Django's makemessages, both domains: `django` for
templates and Python, `djangojs` for static/js; the folders it skips) and compiled, and reading
a `.po` file back (the tests compare it with its `.mo` and with the rendered pages). The
compiled `.mo` files are committed, so a fresh clone, CI and `make run` need no GNU gettext;
this script does (Debian: `apt-get install gettext`). Must not know what the strings say.

    python scripts/messages.py            # extract + compile every language in settings.LANGUAGES
    python scripts/messages.py --check    # extract into a copy; fail if the catalogs miss a string
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
LOCALE_DIR = REPO_DIR / "locale"
DOMAINS = ("django", "djangojs")
# Everything makemessages must not read: installed packages, vendored libraries, generated
# files, data and the tests (their strings are not the product's).
IGNORED = (".venv", "node_modules", "static/vendor", "staticfiles", "data", "test-artifacts", "tests")
# The folders the extraction reads (what `--check` copies).
SOURCES = ("playground", "inference", "templates", "static", "scripts", "manage.py")

_ENTRY = re.compile(r'^(msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?) (".*")$')


def locales() -> list[str]:
    """The catalog folders of every language but English (the source language): ["zh_Hans"]."""
    from django.conf import settings
    from django.utils.translation import to_locale

    return [to_locale(code) for code, _name in settings.LANGUAGES if code != settings.LANGUAGE_CODE]


def makemessages(cwd: Path, languages: list[str]) -> None:
    """Django's extraction of both domains into `cwd`/locale (the settings' LOCALE_PATHS)."""
    for domain in DOMAINS:
        argv = [sys.executable, "-m", "django", "makemessages", "-d", domain, "--no-location", "--no-obsolete"]
        argv += [f"--locale={language}" for language in languages]
        argv += [f"--ignore={path}" for path in IGNORED]
        subprocess.run(argv, cwd=cwd, check=True, env=_env(cwd), stdout=subprocess.DEVNULL)


def compilemessages(cwd: Path) -> None:
    argv = [sys.executable, "-m", "django", "compilemessages", *(f"--ignore={path}" for path in IGNORED)]
    subprocess.run(argv, cwd=cwd, check=True, env=_env(cwd), stdout=subprocess.DEVNULL)


def _env(cwd: Path) -> dict[str, str]:
    """The settings of the tree at `cwd` (a copy gets its own data dir there: nothing is written
    into the real one)."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="playground.settings", PYTHONPATH=str(cwd))
    if cwd != REPO_DIR:
        env["PLAYGROUND_DATA_DIR"] = str(cwd / "data")
    return env


def read_po(path: Path) -> dict[str, str]:
    """A `.po` file as {key: translation}: the key is the msgid, "context\\x04msgid" with a
    context, and a plural entry's msgid maps to its first form (Chinese has one). Fuzzy entries
    are left out (gettext does not use them)."""
    catalog: dict[str, str] = {}
    for entry in po_entries(path):
        if "fuzzy" in entry["flags"] or entry.get("msgid", "") == "":
            continue
        catalog[_key(entry)] = entry.get("msgstr", entry.get("msgstr[0]", ""))
    return catalog


def marked_keys(path: Path) -> list[str]:
    """Every string a `.po` file lists, fuzzy ones too (a fresh extraction marks a string fuzzy
    when it changed but resembles an old one: it is still a string the sources mark)."""
    return [_key(entry) for entry in po_entries(path) if entry.get("msgid", "")]


def _key(entry: dict[str, str]) -> str:
    return entry["msgid"] if "msgctxt" not in entry else f"{entry['msgctxt']}\x04{entry['msgid']}"


def po_entries(path: Path) -> list[dict[str, str]]:
    """Each entry of a `.po` file as {"msgctxt"?, "msgid", "msgid_plural"?, "msgstr" or
    "msgstr[n]", "flags"}, strings unquoted; the header is the entry whose msgid is ""."""
    text = path.read_text(encoding="utf-8")
    entries: list[dict[str, str]] = []
    entry: dict[str, str] = {"flags": ""}
    field = None
    for line in text.splitlines():
        line = line.strip()
        # A blank or comment line after a msgstr starts the next entry: its flags are its own.
        if (not line or line.startswith("#")) and any(key.startswith("msgstr") for key in entry):
            entries.append(entry)
            entry = {"flags": ""}
            field = None
        if line.startswith("#,"):
            entry["flags"] += line[2:]
            continue
        if not line or line.startswith("#"):
            continue
        match = _ENTRY.match(line)
        if match:
            field = match.group(1)
            if field in ("msgctxt", "msgid") and any(key.startswith("msgstr") for key in entry):
                entries.append(entry)
                entry = {"flags": ""}
            entry[field] = ast.literal_eval(match.group(2))
        elif line.startswith('"') and field:
            entry[field] += ast.literal_eval(line)
    if any(key.startswith("msgid") for key in entry):
        entries.append(entry)
    return entries


def missing_strings() -> dict[str, list[str]]:
    """Extracts the catalogs again in a copy of the sources: per catalog file, the strings the
    sources mark for translation that the committed catalog lacks (or has untranslated)."""
    missing: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="messages-check-") as tmp:
        copy = Path(tmp)
        for name in SOURCES:
            source = REPO_DIR / name
            if source.is_dir():
                shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "vendor"))
            else:
                shutil.copy2(source, copy / name)
        shutil.copytree(LOCALE_DIR, copy / "locale")
        makemessages(copy, locales())
        for fresh in sorted((copy / "locale").glob("*/LC_MESSAGES/*.po")):
            committed = read_po(LOCALE_DIR / fresh.relative_to(copy / "locale"))
            lacking = [key for key in marked_keys(fresh) if not committed.get(key)]
            if lacking:
                missing[str(fresh.relative_to(copy))] = lacking
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the catalogs list every string")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
    import django

    django.setup()
    if shutil.which("msgfmt") is None:
        print("GNU gettext is missing (Debian: apt-get install gettext)", file=sys.stderr)
        return 2
    if args.check:
        missing = missing_strings()
        for path, keys in missing.items():
            print(f"{path}: {len(keys)} strings without a translation", *(f"  {key!r}" for key in keys), sep="\n")
        return 1 if missing else 0
    makemessages(REPO_DIR, locales())
    compilemessages(REPO_DIR)
    print("catalogs refreshed: translate the new empty msgstr entries, then run this again to compile them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
