"""What setup.cfg and MANIFEST.in put in the sdist and the wheel.

``tox -e package`` builds both and checks their metadata; these tests catch,
without a build, what a build would only warn about: a folder of the package
that setuptools does not list ("Package would be ignored"), and a file the
package reads at run time that no package-data pattern ships.
"""

from __future__ import annotations

import configparser
import fnmatch
from pathlib import Path

import django_redislock

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "django_redislock"


def _setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.strip().splitlines() if line.strip()]


def _folders() -> set[str]:
    """Every folder of the package that holds a file, as a dotted name."""
    return {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _found(include: list[str], exclude: list[str]) -> set[str]:
    """What ``find_namespace:`` lists: every folder matched by include and not by exclude."""
    folders = {
        ".".join(path.relative_to(ROOT).parts)
        for path in [PACKAGE, *PACKAGE.rglob("*")]
        if path.is_dir() and all(part.isidentifier() for part in path.relative_to(ROOT).parts)
    }
    return {
        name
        for name in folders
        if any(fnmatch.fnmatchcase(name, x) for x in include)
        and not any(fnmatch.fnmatchcase(name, x) for x in exclude)
    }


def test_every_folder_of_the_package_is_a_listed_package() -> None:
    cfg = _setup_cfg()
    assert cfg["options"]["packages"] == "find_namespace:"
    find = cfg["options.packages.find"]
    packages = _found(_lines(find["include"]), _lines(find.get("exclude", "")))
    assert {"django_redislock", "django_redislock.core"} <= packages
    assert _folders() <= packages, _folders() - packages
    assert not any("__pycache__" in p for p in packages)


def test_every_file_the_package_reads_is_package_data() -> None:
    patterns = _lines(_setup_cfg()["options.package_data"]["*"])
    data = [
        path
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".py"
    ]
    assert any(p.suffix == ".lua" for p in data) and any(p.suffix == ".html" for p in data)
    unshipped = [p for p in data if not any(fnmatch.fnmatch(p.name, x) for x in patterns)]
    assert not unshipped, unshipped


def test_the_sdist_carries_no_part_of_the_suite() -> None:
    """MANIFEST.in: the suite needs the whole checkout, so the sdist has none of it
    (setuptools would otherwise add tests/test_*.py without conftest.py)."""
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "prune tests" in manifest


def test_the_metadata_names_the_project() -> None:
    meta = _setup_cfg()["metadata"]
    assert meta["version"] == "attr: django_redislock.__version__"
    assert django_redislock.__version__ != "0.1.0"
    assert meta["license_expression"] == "BSD-3-Clause" and "license" not in meta
    assert meta["author"]
    urls = dict(line.split(" = ", 1) for line in _lines(meta["project_urls"]))
    assert set(urls) == {"Documentation", "Changelog", "Source", "Issues"}
    assert urls["Issues"] == urls["Source"] + "/issues"
