"""Docs kept true by tests (issue 49): the settings table is complete and every file a doc names exists.

Owns: collecting the environment variables `playground/settings.py` and `scripts/` read (from their
source: `os.environ.get`, `os.environ[...]`, `os.getenv`, the settings' `env_*` helpers, a shell
script's `${NAME:-default}`) and checking each has a row in docs/running.md; collecting the
repository paths README.md and docs/*.md name (backticked, linked or plain: `playground/...`,
`tests/...`, a link to another doc, `coord/cancel.py` under its package) and checking each exists.
Must not know: what the settings mean (docs/running.md says that).
"""

from __future__ import annotations

import ast
import glob
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNNING_MD = REPO / "docs" / "running.md"
SETTINGS_SOURCES = [REPO / "playground" / "settings.py", *sorted((REPO / "scripts").glob("*.py"))]
SHELL_SOURCES = sorted((REPO / "scripts").glob("*.sh"))
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# ---- environment variables ---------------------------------------------------------------------

_ENV_GETTERS = {"os.environ.get", "environ.get", "os.getenv", "getenv"}
_SHELL_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?[-=]")


def _string_arg(call: ast.Call) -> str | None:
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _read_name(node: ast.AST) -> str | None:
    """The variable a node reads from the environment, if it is such a read."""
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        if func in _ENV_GETTERS or (isinstance(node.func, ast.Name) and node.func.id.startswith("env_")):
            return _string_arg(node)
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and ast.unparse(node.value) == "os.environ":
        key = node.slice
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
    return None


def python_env_reads(source: str) -> set[str]:
    return {name for node in ast.walk(ast.parse(source)) if (name := _read_name(node))}


def shell_env_reads(source: str) -> set[str]:
    """The variables a shell script takes from its caller with a default (`${NAME:-180}`)."""
    return set(_SHELL_DEFAULT.findall(source))


def env_reads() -> dict[str, str]:
    """Every variable the settings and scripts read -> the first file that reads it."""
    found: dict[str, str] = {}
    for path in SETTINGS_SOURCES + SHELL_SOURCES:
        text = path.read_text(encoding="utf-8")
        names = python_env_reads(text) if path.suffix == ".py" else shell_env_reads(text)
        for name in sorted(names):
            found.setdefault(name, str(path.relative_to(REPO)))
    return found


def documented_variables(markdown: str) -> set[str]:
    """The backticked names in the first cell of every table row (one row may name several)."""
    cells = (line.split("|")[1] for line in markdown.splitlines() if line.startswith("|") and line.count("|") > 2)
    return {name for cell in cells for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cell)}


def test_the_collector_finds_each_kind_of_read() -> None:
    source = 'import os\na = os.environ.get("A", "1")\nb = os.environ["B"]\nc = os.getenv("C")\nd = env_int("D", 2)\n'
    assert python_env_reads(source) == {"A", "B", "C", "D"}
    assert shell_env_reads('X=${X:-180}\necho "${Y}" "${PIPESTATUS[0]}"\n') == {"X"}
    reads = env_reads()
    assert {"PLAYGROUND_DEVICE", "PLAYGROUND_KV_CACHE_MB", "REDIS_URL", "PORT", "TESTS_TIMEOUT_S"} <= reads.keys()


def test_every_environment_variable_has_a_row_in_running_md() -> None:
    documented = documented_variables(RUNNING_MD.read_text(encoding="utf-8"))
    missing = [f"{name} (read in {path})" for name, path in sorted(env_reads().items()) if name not in documented]
    assert not missing, "docs/running.md has no table row for: " + ", ".join(missing)


# ---- file paths ------------------------------------------------------------------------------

TOP_FOLDERS = ("playground", "inference", "tests", "scripts", "static", "templates", "docs", "locale", ".ci")
_ROOTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(t) for t in TOP_FOLDERS)})/[\w./*-]*[\w*])")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")
_FILE_EXTENSIONS = "py|md|js|css|html|sh|c|h|yml|yaml|json|txt|po|mo|toml|ini"
_SHORT = re.compile(rf"^[\w-]+(?:/[\w.-]+)+\.(?:{_FILE_EXTENSIONS})$")
# Where a short path (`coord/cancel.py`, `openai_api/auth.py`) may sit: the packages docs name files in.
SHORT_ROOTS = ("", "playground/", "playground/web/", "inference/", "tests/", "static/")
# Paths in another project's repository, named as such.
ELSEWHERE = {("deepseek.md", "inference/configs")}  # DeepSeek-V3's own repository


@dataclass(frozen=True)
class Named:
    doc: str
    line: int
    path: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.path}"


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def named_paths(doc: Path, text: str) -> Iterator[tuple[Named, list[Path]]]:
    """Each path `text` (the doc `doc`) names, with the places it may be (it exists if one does)."""
    name = str(doc.relative_to(REPO))
    for match in _ROOTED.finditer(text):
        if (doc.name, match.group(1)) not in ELSEWHERE:
            yield Named(name, _line(text, match.start()), match.group(1)), [REPO / match.group(1)]
    for match in _LINK.finditer(text):
        target = match.group(1)
        if not re.match(r"[a-z][a-z0-9+.-]*:|[#/]", target):  # a URL, an anchor, a site path
            yield Named(name, _line(text, match.start()), target), [doc.parent / re.split(r"[#?]", target)[0]]
    for match in _CODE.finditer(text):
        for token in re.split(r"[\s,()]+", match.group(1)):
            token = token.split("::")[0].strip(":;.'\"")
            if _SHORT.match(token) and not _ROOTED.fullmatch(token):
                yield Named(name, _line(text, match.start()), token), [REPO / root / token for root in SHORT_ROOTS]


def _file_parts(path: Path) -> list[Path]:
    """`path` and what it names when it is `file.py.function` or `package/module.function`."""
    text = str(path)
    parts = [path]
    if match := re.match(rf"(.*?\.(?:{_FILE_EXTENSIONS}))\.\w+$", text):
        parts.append(Path(match.group(1)))
    elif re.search(r"/\w+\.\w+$", text):
        parts.append(Path(text.rsplit(".", 1)[0] + ".py"))
    return parts


def exists(place: Path) -> bool:
    if "*" in str(place):
        return bool(glob.glob(str(place)))
    return any(part.exists() for part in _file_parts(place))


def test_the_path_finder_reads_each_form() -> None:
    text = (
        "See `playground/worker/generation.py::test_x`, [ui](ui.md#languages), web/following.py,\n"
        "`coord/cancel.py`, `tests/*/test_import_boundary.py`, https://x.org/tests/nothing.py, `/static/x.js`.\n"
    )
    found = {named.path: places for named, places in named_paths(REPO / "docs" / "probe.md", text)}
    assert set(found) == {
        "playground/worker/generation.py",
        "ui.md#languages",
        "coord/cancel.py",
        "tests/*/test_import_boundary.py",
    }
    assert all(any(exists(p) for p in places) for places in found.values())
    assert not exists(REPO / "scripts/measure_presets.py")
    assert exists(REPO / "inference/sampling/sampler.sample_rows")


def test_every_file_a_doc_names_exists() -> None:
    missing = [
        str(named)
        for doc in DOCS
        for named, places in named_paths(doc, doc.read_text(encoding="utf-8"))
        if not any(map(exists, places))
    ]
    assert not missing, "docs name files that do not exist:\n" + "\n".join(missing)
