"""The test tree mirrors the packages it tests (issue 49): `tests/inference/<sub>/` holds the tests of
`inference/<sub>/`, `tests/playground/<sub>/` those of `playground/<sub>/`, and each root the tests of
its package's top-level modules.

Owns: checking that every folder under tests/inference and tests/playground that holds a test file
names an existing package folder, and is itself a package (an `__init__.py`, so two test files of the
same name in different folders do not collide).
Must not know: which test belongs where (the imports of a test file say that).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MIRRORED = ("inference", "playground")  # tests/<name>/ mirrors <name>/


def folders_with_tests(repo: Path, package: str) -> list[Path]:
    """The folders under tests/<package>/ (itself included) that hold a test file, relative to it."""
    root = repo / "tests" / package
    return sorted({path.parent.relative_to(root) for path in root.rglob("test_*.py")})


def stray_folders(repo: Path, package: str) -> list[str]:
    """Test folders with no package folder of the same path under <package>/."""
    return [
        f"tests/{package}/{folder}/ (no {package}/{folder}/__init__.py)"
        for folder in folders_with_tests(repo, package)
        if not (repo / package / folder / "__init__.py").is_file()
    ]


def folders_without_init(repo: Path, package: str) -> list[str]:
    """Test folders (or folders above them, up to tests/<package>/) that are no package."""
    root = repo / "tests" / package
    return sorted(
        {
            f"tests/{package}/{part}/__init__.py"
            for folder in folders_with_tests(repo, package)
            for part in [folder, *folder.parents]
            if not (root / part / "__init__.py").is_file()
        }
    )


@pytest.mark.parametrize("package", MIRRORED)
def test_every_test_folder_mirrors_a_package_folder(package: str) -> None:
    assert folders_with_tests(REPO, package), f"no tests under tests/{package}/"
    stray = stray_folders(REPO, package)
    assert not stray, "test folders that mirror no package folder: " + ", ".join(stray)


@pytest.mark.parametrize("package", MIRRORED)
def test_every_test_folder_is_a_package(package: str) -> None:
    missing = folders_without_init(REPO, package)
    assert not missing, "missing: " + ", ".join(missing)


def test_the_checks_find_a_folder_that_mirrors_nothing(tmp_path: Path) -> None:
    for folder in ("inference", "inference/kv", "tests/inference", "tests/inference/kv", "tests/inference/foo"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        if folder != "tests/inference/foo":
            (tmp_path / folder / "__init__.py").touch()
    for folder in ("tests/inference", "tests/inference/kv", "tests/inference/foo"):
        (tmp_path / folder / "test_x.py").touch()
    assert stray_folders(tmp_path, "inference") == ["tests/inference/foo/ (no inference/foo/__init__.py)"]
    assert folders_without_init(tmp_path, "inference") == ["tests/inference/foo/__init__.py"]
