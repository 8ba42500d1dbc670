"""codebase_search: chunking, semantic ranking, the per-layer cache reused across forks, BM25."""

from pathlib import Path

import pytest

from opencomposer.harness import search
from opencomposer.harness.search import MiniLMEmbedder, chunk_file
from opencomposer.harness.tools import ToolBox, ToolConfig
from opencomposer.sandbox import get_backend

FILES = {
    "net/fetch.py": '''import time
import urllib.request


def download_with_retries(url, attempts=3, backoff=0.5):
    """Fetch a URL over HTTP, trying again with exponential backoff when the request fails."""
    for i in range(attempts):
        try:
            return urllib.request.urlopen(url).read()
        except OSError:
            time.sleep(backoff * 2 ** i)
    raise RuntimeError("giving up")
''',
    "text/slug.py": '''import re


def slugify(title):
    """Lowercase a title and join its words with hyphens, for use in a URL."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
''',
    "stats/mean.py": '''def average(values):
    """Arithmetic mean of a list of numbers."""
    return sum(values) / len(values)


def median(values):
    s = sorted(values)
    return s[len(s) // 2]
''',
    "db/users.py": '''import sqlite3


class UserStore:
    """Persist user accounts in a SQLite database."""

    def __init__(self, path):
        self.conn = sqlite3.connect(path)

    def add_user(self, name, email):
        self.conn.execute("INSERT INTO users VALUES (?, ?)", (name, email))
''',
    "README.md": "# toolkit\n\nSmall helpers: networking, text, statistics, storage.\n",
}


def make_tree(root: Path) -> Path:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


class HostDir:
    def __init__(self, root):
        self.root = Path(root)


@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()


def top_path(output: str) -> str:
    return output.splitlines()[2].split(". ", 1)[1].split(":")[0]


# ---------------------------------------------------------------- chunking

def test_python_chunks_follow_definitions():
    src = "import os\nX = 1\n\n\n@decorator\ndef f():\n    return 1\n\n\nclass A:\n    pass\n"
    chunks = chunk_file("m.py", src)
    assert [(c.start, c.end) for c in chunks] == [(1, 4), (5, 7), (10, 11)]  # blank gap 8-9 dropped
    big = "class Big:\n    x = 1\n" + "".join(f"    def m{i}(self):\n" + "        pass\n" * 10 for i in range(10))
    chunks = chunk_file("big.py", big)
    methods = [c for c in chunks if c.context == "class Big"]
    assert len(methods) >= 10 and methods[1].start == 3 and methods[1].end == 13


def test_text_chunks_are_overlapping_windows_and_broken_python_falls_back():
    text = "".join(f"line {i}\n" for i in range(100))
    assert [(c.start, c.end) for c in chunk_file("a.txt", text)] == [(1, 40), (31, 70), (61, 100)]
    assert [(c.start, c.end) for c in chunk_file("bad.py", "def (:\n" * 50)] == [(1, 40), (31, 50)]


# ---------------------------------------------------------------- semantic search

def test_finds_functions_by_meaning(tmp_path, embedder):
    root = make_tree(tmp_path / "ws")
    box = ToolBox(HostDir(root), ToolConfig(search_cache_dir=tmp_path / "cache"), embedder=embedder)
    queries = {
        "retry a network request when it fails": "net/fetch.py",
        "make a URL-friendly string from a title": "text/slug.py",
        "save accounts to a database": "db/users.py",
    }
    for query, want in queries.items():
        r = box.call("codebase_search", {"query": query})
        assert r.ok, r.error
        assert "(embeddings)" in r.output
        assert top_path(r.output) == want, (query, r.output)
    r = box.call("codebase_search", {"query": "arithmetic mean", "path": "stats", "top_k": 1})
    assert r.output.count("\n1. ") == 1 and "stats/mean.py:1-3" in r.output and "def average" in r.output


def test_layer_cache_is_reused_by_forks_and_only_changes_are_embedded(tmp_path, embedder):
    backend = get_backend("bwrap", store_dir=tmp_path / "store")
    image = backend.image_from_dir(make_tree(tmp_path / "src"))
    cfg = ToolConfig(search_cache_dir=tmp_path / "cache")
    n_chunks = sum(len(chunk_file(rel, text)) for rel, text in FILES.items())

    with image.workspace() as ws1:
        before = embedder.n_embedded
        assert ToolBox(ws1, cfg, embedder=embedder).call("codebase_search", {"query": "slugify"}).ok
        assert embedder.n_embedded - before == n_chunks + 1  # every chunk of the layer, plus the query
        forks = ws1.fork(2)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1

    search.clear_memory_cache()  # as a new process would: the layer index comes from disk
    try:
        box = ToolBox(forks[0], cfg, embedder=embedder)
        before = embedder.n_embedded
        r = box.call("codebase_search", {"query": "retry a network request when it fails"})
        assert top_path(r.output) == "net/fetch.py"
        assert embedder.n_embedded - before == 1  # only the query

        # The agent rewrites one file in its fork: only that file is embedded again.
        assert box.call("write_file", {"path": "text/slug.py", "content":
                                       'def compress_bytes(data):\n    """Gzip-compress bytes."""\n'
                                       '    import gzip\n    return gzip.compress(data)\n'}).ok
        before = embedder.n_embedded
        r = box.call("codebase_search", {"query": "gzip compression of bytes"})
        assert embedder.n_embedded - before == 1 + 1  # the new file's one chunk, plus the query
        assert top_path(r.output) == "text/slug.py" and "compress_bytes" in r.output

        # The other fork still sees (and reuses the vectors of) the original file.
        before = embedder.n_embedded
        r = ToolBox(forks[1], cfg, embedder=embedder).call("codebase_search", {"query": "URL-friendly title"})
        assert top_path(r.output) == "text/slug.py" and "slugify" in r.output
        assert embedder.n_embedded - before == 1
    finally:
        for ws in forks:
            ws.close()


def test_plain_directory_keeps_an_incremental_disk_cache(tmp_path, embedder):
    root = make_tree(tmp_path / "ws")
    cfg = ToolConfig(search_cache_dir=tmp_path / "cache")
    ToolBox(HostDir(root), cfg, embedder=embedder).call("codebase_search", {"query": "mean"})
    (root / "stats" / "mean.py").write_text("def variance(xs):\n    return 0\n")
    before = embedder.n_embedded
    r = ToolBox(HostDir(root), cfg, embedder=embedder).call("codebase_search", {"query": "variance"})
    assert embedder.n_embedded - before == 2  # the edited file's chunk and the query
    assert top_path(r.output) == "stats/mean.py"


# ---------------------------------------------------------------- BM25

def test_bm25_when_configured(tmp_path):
    root = make_tree(tmp_path / "ws")
    box = ToolBox(HostDir(root), ToolConfig(search_backend="bm25"))
    r = box.call("codebase_search", {"query": "UserStore add user"})
    assert r.ok and "(bm25)" in r.output and top_path(r.output) == "db/users.py"
    r = box.call("codebase_search", {"query": "download retries"})  # snake_case parts are indexed
    assert top_path(r.output) == "net/fetch.py"
    assert "No results" in box.call("codebase_search", {"query": "zebra"}).output


def test_bm25_fallback_without_the_model_package(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "embedding_available", lambda: False)
    root = make_tree(tmp_path / "ws")
    r = ToolBox(HostDir(root)).call("codebase_search", {"query": "slugify title"})
    assert r.ok and "(bm25)" in r.output and top_path(r.output) == "text/slug.py"
    r = ToolBox(HostDir(root), ToolConfig(search_backend="embed")).call("codebase_search", {"query": "x"})
    assert not r.ok and r.stats.error_kind == "setup" and "opencomposer[embed]" in r.error


def test_bm25_scores_rank_rare_terms_higher():
    docs = [search.tokenize(t) for t in ["parse config file", "config config", "render html page"]]
    scores = search.bm25_scores("parse config", docs)
    assert scores[0] > scores[1] > scores[2] == 0
    assert search.tokenize("loadHTTPConfig snake_case") == [
        "loadhttpconfig", "load", "http", "config", "snake_case", "snake", "case"]


def test_index_layers_builds_ahead_of_the_first_search(tmp_path, embedder):
    backend = get_backend("bwrap", store_dir=tmp_path / "store")
    image = backend.image_from_dir(make_tree(tmp_path / "src"))
    cfg = ToolConfig(search_cache_dir=tmp_path / "cache")
    n_chunks = sum(len(chunk_file(rel, text)) for rel, text in FILES.items())
    assert search.index_layers(image.layers, cfg, embedder) == n_chunks
    search.clear_memory_cache()
    with image.workspace() as ws:
        before = embedder.n_embedded
        r = ToolBox(ws, cfg, embedder=embedder).call("codebase_search", {"query": "median of numbers"})
        assert embedder.n_embedded - before == 1 and top_path(r.output) == "stats/mean.py"
