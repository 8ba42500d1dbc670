"""The miner's view of a source tree: an sdist's identity and download, its tests, its sys.path entry.

Left out: wheels (the tests live in sdists) and building the project (its tree is put on
sys.path with a .pth file instead).
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from opencomposer.errors import TaskError
from opencomposer.sandbox.base import Backend
from opencomposer.tasks.build import _download_sdist
from opencomposer.tasks.cache import cache_dir
from opencomposer.tasks.metadata import norm


def sdist_metadata(archive: Path) -> tuple[str, str]:
    """(Name, Version) from the sdist's top-level PKG-INFO."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith("/PKG-INFO")]
            text = z.read(names[0]).decode() if names else ""
    else:
        with tarfile.open(archive) as t:
            member = next((m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None)
            text = t.extractfile(member).read().decode() if member else ""
    meta = Parser().parsestr(text)
    if not meta.get("Name") or not meta.get("Version"):
        raise TaskError(f"{archive}: no PKG-INFO with Name and Version at the top level; is it an sdist?")
    return meta["Name"], meta["Version"]


def fetch_sdist(spec: str, backend: Backend) -> Path:
    """Download NAME==VERSION's sdist (in a sandbox, as build.py does) into the miner's cache."""
    if "==" not in spec:
        raise TaskError(f"--package {spec!r}: pin an exact version, e.g. {spec}==1.0")
    name, version = (s.strip() for s in spec.split("==", 1))
    dest = cache_dir() / "mine" / "sdists"
    found = sorted(dest.glob(f"{name.replace('-', '_')}-{version}.*")) + sorted(dest.glob(f"{name}-{version}.*"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        got = _download_sdist(name, version, backend, Path(tmp))
        target = dest / got.name
        shutil.copyfile(got, target)
    return target


def find_test_paths(root: Path, package: str) -> list[str]:
    """The test directories of an unpacked sdist, or [] if it ships no tests."""
    mod = norm(package).replace("-", "_")
    for cand in ("tests", "test", "testing", f"{mod}/tests", f"src/{mod}/tests", f"{mod}/test"):
        if (root / cand).is_dir() and any((root / cand).rglob("test*.py")):
            return [cand]
    return []


def pth_setup(root: Path) -> str:
    """The setup command that puts the source tree (src/ layout or flat) on the venv's sys.path."""
    where = "/workspace/src" if (root / "src").is_dir() else "/workspace"
    return (f"echo {where} > \"$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
            "/oc-source.pth\"")
