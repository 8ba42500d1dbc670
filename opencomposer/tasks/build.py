"""Task images: the sandbox layers a task's workspace is made of, built once and cached.

    generated task:  [venv layer (requirements)]            + task/workspace/ (in place)
    pypi task:       [source layer (sdist)] + [env layer]   + task layer (break.patch applied)
    local task:      [source layer (a copy of the project directory, local.py)] + the same

- source layer: the sdist, downloaded with `pip download --no-binary :all: --no-deps
  PACKAGE==VERSION` *inside a sandbox* (pip prepares metadata, which runs the package's
  build code), checked against the task's sha256 on the host, and unpacked on the host with
  tarfile's "data" filter (no absolute paths, no links out of the tree, no devices). The
  sdist's top directory becomes /workspace.
- env (venv) layer: `/usr/bin/python3 -m venv /workspace/.venv` run inside a sandbox with
  `Limits(network=True)`, so that every path the venv records is valid at /workspace in any
  fork; then `pip install` of the pinned requirements and the task's setup commands; `pip
  freeze --all` is kept as `lock.txt` beside the layer. The layer is what the build wrote
  (the snapshot's top layer, copied out of the sandbox store with `cp -a`, whiteouts and
  all), so an editable install's metadata in the source tree comes with it.
- task layer (pypi only): break.patch applied with `git apply` in a sandbox, snapshotted;
  kept per process (applying a patch costs milliseconds).

Cache layout (OPENCOMPOSER_CACHE, default ~/.cache/opencomposer):

    sources/<package>-<version>-<sha256[:16]>/layer     unpacked sdist
    envs/<key>/layer, envs/<key>/lock.txt                venv layers; key = sha256 of
                                                         (python, requirements, setup, source)

A layer is built into a temporary directory and renamed into place, under a file lock, so
concurrent builders (processes or threads) build it once. Cold builds need the network
(PyPI); warm ones do not.

Left out: wheels-only packages (the source must be an sdist), non-Python build steps
(compilers are whatever the host's /usr has), and eviction of old cache entries.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
import threading
import zipfile
from functools import lru_cache
from pathlib import Path

from opencomposer.errors import TaskError
from opencomposer.sandbox.base import Backend, Image, Limits, Workspace
from opencomposer.tasks.cache import cache_dir, locked
from opencomposer.tasks.local import local_source_layer
from opencomposer.tasks.task import Task

SYSTEM_PYTHON = "/usr/bin/python3"
FIND_LINKS = ".oc-find-links"
"""Where a --find-links directory appears inside a build sandbox (/workspace/.oc-find-links)."""
BUILD_LIMITS = Limits(timeout_s=900, memory_mb=4096, pids=1024, network=True, output_bytes=200_000)
_task_images: dict[tuple[str, str], Image] = {}
_guard = threading.Lock()


def default_backend() -> Backend:
    from opencomposer.sandbox import get_backend

    return get_backend("bwrap")


@lru_cache(maxsize=1)
def _python_version() -> str:
    return subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _check(res, what: str) -> None:
    if not res.ok:
        why = "timed out" if res.timed_out else f"exit code {res.exit_code}"
        raise TaskError(f"{what} failed ({why}):\n{(res.stdout + res.stderr)[-3000:]}")


def _copy_layer(src: Path, dest: Path) -> None:
    """Copy a sandbox-store layer to `dest` atomically (cp -a keeps whiteouts and xattrs)."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.parent))
    try:
        subprocess.run(["cp", "-a", f"{src}/.", str(tmp)], check=True, capture_output=True)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------- source layer (sdist)


def source_layer(package: str, version: str, sha256: str, *, backend: Backend | None = None,
                 sdist: Path | None = None) -> Path:
    """The unpacked sdist of package==version as a layer dir (downloaded once, sha256-checked).

    `sdist` uses a local archive instead of downloading (it is still checked against sha256).
    """
    key = f"{package}-{version}-{sha256[:16]}"
    dest = cache_dir() / "sources" / key / "layer"
    if dest.is_dir():
        return dest
    with locked(f"source-{key}"):
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            archive = Path(sdist) if sdist else _download_sdist(package, version, backend or default_backend(), Path(tmp))
            digest = hashlib.sha256(archive.read_bytes()).hexdigest()
            if digest != sha256:
                raise TaskError(f"{archive.name}: sha256 {digest} does not match the task's source.sha256 "
                                f"{sha256} (a different upload of {package}=={version}? fix task.toml)")
            unpacked = Path(tmp) / "unpacked"
            _unpack(archive, unpacked)
            tops = list(unpacked.iterdir())
            root = tops[0] if len(tops) == 1 and tops[0].is_dir() else unpacked
            root.rename(dest)
    return dest


def _download_sdist(package: str, version: str, backend: Backend, out: Path) -> Path:
    ws = backend.image_from_dir(_empty_dir()).workspace()
    try:
        res = ws.exec(f"{SYSTEM_PYTHON} -m venv /tmp/dl && /tmp/dl/bin/pip download --no-cache-dir "
                      f"--disable-pip-version-check --no-binary :all: --no-deps -d /workspace/dl "
                      f"'{package}=={version}'", limits=BUILD_LIMITS)
        _check(res, f"pip download {package}=={version}")
        files = [p for p in (ws.root / "dl").iterdir() if p.is_file() and not p.is_symlink()]
        if len(files) != 1:
            raise TaskError(f"pip download {package}=={version} gave {[p.name for p in files]}, expected one sdist")
        target = out / files[0].name
        shutil.copyfile(files[0], target)
        return target
    finally:
        ws.close()


def _unpack(archive: Path, dest: Path) -> None:
    dest.mkdir()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise TaskError(f"{archive.name}: unsafe member path {name!r}")
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")


@lru_cache(maxsize=1)
def _empty_dir() -> Path:
    path = cache_dir() / "empty"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- env layer (venv)


def env_layer(requirements: list[str], *, setup: list[str] = (), source: Path | None = None,
              backend: Backend | None = None, find_links: Path | None = None) -> Path:
    """A layer holding /workspace/.venv with `requirements` installed (plus what `setup` wrote).

    `source` is the layer the setup commands run over (the unpacked sdist), None for generated
    tasks, whose venv is shared by every task with the same requirements. `find_links` is a
    host directory of wheels/sdists pip may install from besides PyPI (a local project's own
    dependencies); it is seen at /workspace/.oc-find-links during the build only.
    """
    fields = {"python": _python_version(), "requirements": sorted(requirements), "setup": list(setup),
              "source": str(source) if source else None}
    links = find_links_layer(find_links) if find_links else None
    if links:  # only then: the keys of every existing venv stay what they were
        fields["find_links"] = links.parent.name
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]
    dest = cache_dir() / "envs" / key / "layer"
    if dest.is_dir():
        return dest
    with locked(f"env-{key}"):
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        backend = backend or default_backend()
        base = source or _empty_dir()
        ws = (backend.image([base, links]) if links else backend.image_from_dir(base)).workspace()
        try:
            _check(ws.exec([SYSTEM_PYTHON, "-m", "venv", "/workspace/.venv"], limits=BUILD_LIMITS),
                   "creating the venv")
            extra = ["--find-links", f"/workspace/{FIND_LINKS}"] if links else []
            _check(ws.exec([".venv/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check",
                            "--no-input", *extra, *requirements], limits=BUILD_LIMITS), f"pip install {requirements}")
            for cmd in setup:
                _check(ws.exec(cmd, limits=BUILD_LIMITS), f"setup command {cmd!r}")
            lock = ws.exec([".venv/bin/pip", "freeze", "--all", "--disable-pip-version-check"], limits=BUILD_LIMITS)
            _check(lock, "pip freeze")
            _check_pins(requirements, lock.stdout)
            image = ws.snapshot()
            _copy_layer(image.layers[-1], dest)
            (dest.parent / "lock.txt").write_text(lock.stdout)
        finally:
            ws.close()
    return dest


def find_links_layer(path: Path) -> Path:
    """A layer holding a copy of the distributions in `path` under .oc-find-links/ (cached by content)."""
    files = sorted(p for p in Path(path).iterdir() if p.is_file() and p.name.endswith((".whl", ".tar.gz", ".zip")))
    if not files:
        raise TaskError(f"--find-links {path}: no wheels or sdists (.whl, .tar.gz, .zip) in it")
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    dest = cache_dir() / "find-links" / digest.hexdigest()[:20] / "layer"
    if not dest.is_dir():
        with locked(f"links-{dest.parent.name}"):
            if not dest.is_dir():
                tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=_mkdir(dest.parent)))
                (tmp / FIND_LINKS).mkdir()
                for f in files:
                    shutil.copyfile(f, tmp / FIND_LINKS / f.name)
                tmp.rename(dest)
    return dest


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check_pins(requirements: list[str], frozen: str) -> None:
    got = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
           for line in frozen.splitlines() if "==" in line}
    for req in requirements:
        name, ver = (s.strip() for s in req.split("==", 1))
        if got.get(name.lower().replace("_", "-")) != ver.split(";")[0].strip():
            raise TaskError(f"requirement {req} was not installed at that version (pip freeze: "
                            f"{got.get(name.lower())}); check the task's environment.requirements")


# ---------------------------------------------------------------- task images


def base_image(task: Task, backend: Backend | None = None) -> Image:
    """The layers under a task's own state: the venv (generated) or sdist + env (pypi)."""
    backend = backend or default_backend()
    env = task.spec.environment
    if task.spec.source.kind == "generated":
        return backend.image([env_layer(env.requirements, backend=backend)])
    src = task.spec.source
    if src.kind == "local":

        source = local_source_layer(Path(src.path), src.package, src.version, src.sha256)
    else:
        source = source_layer(src.package, src.version, src.sha256, backend=backend)
    links = Path(env.find_links) if env.find_links else None
    return backend.image([source, env_layer(env.requirements, setup=env.setup, source=source, backend=backend,
                                            find_links=links)])


def task_image(task: Task, backend: Backend | None = None) -> Image:
    """The image of the task's broken workspace as the agent starts it (no hidden tests)."""
    backend = backend or default_backend()
    if task.spec.source.kind == "generated":
        return backend.image([*base_image(task, backend).layers, task.workspace_dir])
    key = (str(task.path.resolve()), hashlib.sha256(task.break_patch.encode()).hexdigest())
    with _guard:
        if key in _task_images:
            return _task_images[key]
    ws: Workspace = base_image(task, backend).workspace()
    try:
        res = ws.exec(["git", "apply", "--whitespace=nowarn", "-"], stdin=task.break_patch.encode(),
                      limits=Limits(timeout_s=120))
        _check(res, f"{task.path}/break.patch (git apply on {task.spec.source.package}=={task.spec.source.version})")
        image = ws.snapshot()
    finally:
        ws.close()
    with _guard:
        return _task_images.setdefault(key, image)
