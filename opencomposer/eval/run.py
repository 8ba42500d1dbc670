"""Evaluation: run one policy on a suite, N passes per task, and grade every episode.

For each task x pass: a fresh workspace of the task's image (tasks/build.py), one episode of
the agent loop (harness/agent.py) under the task timeout, the workspace's diff as the
patch (the venv and caches left out), and the grader's verdict on it (tasks/grade.py:
fresh fork, hidden tests). Episodes run `concurrency` at a time.

Policy specs (`parse_policy`):

    oracle                  replays each task's gold patch (must score 100%)
    oracle:tests            the same, then runs the visible tests once
    noop                    answers at once without tools (must score 0%)
    openai:MODEL@BASE_URL   an OpenAI-compatible chat endpoint (hosted APIs: prices via
                            EvalOptions / --input-price --output-price, key from $OPENAI_API_KEY)
    sglang:BASE_URL         token level over SGLang's /generate (opencomposer's server, SGLang),
                            encoding with --tokenizer (default: the bundled one)
    vllm:MODEL@BASE_URL     token level over a running vLLM's /v1/completions
    vllm:CKPT_DIR           a vLLM server this run starts on the checkpoint (options `vllm`, its
                            log in <out>/vllm/) and stops at the end; `vllm_endpoint` "chat"
                            (default): its /v1/chat/completions with the checkpoint's chat template
                            and opencomposer's tool-call parser plugin (engine/vllm_tool_parser.py),
                            malformed calls returned to the model as tool errors; "tokens": token
                            ids through /v1/completions, rendered and parsed here (exact ids and logprobs)
    engine:CKPT_DIR         the embedded engine over an HF-format checkpoint, in process

Output directory:

    run.json                what ran: suite, policy, passes, options, agent config (written first)
    results.jsonl           one row per finished task x pass, appended as each one ends
    trajectories.jsonl      one trajectory per finished task x pass (with patch, grade, reward)
    partial/<id>.json       running episodes, saved after every step (removed when done)
    results.json            run.json's fields + every row + the summary (report.summarize)

Resumable: rerunning with the same --out skips every task x pass whose row says "done";
episodes that ended in an error (an endpoint down, a task image that failed to build) are
run again. A different suite or policy in an existing --out is refused.

Left out: sharding a suite across machines (run disjoint --tasks globs into separate dirs),
retries within a run.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field, model_validator

from opencomposer.config import REQUIRED, RunConfig, Section, variant
from opencomposer.device import DeviceName, resolve_device
from opencomposer.engine.vllm_server import VLLMConfig
from opencomposer.errors import ConfigError
from opencomposer.eval.report import summarize
from opencomposer.eval.results import PARTIAL, RESULTS, RUN, SUMMARY, TRAJECTORIES, Row, read_rows
from opencomposer.harness.agent import Agent, AgentConfig, ChatClientPolicy, TokenClientPolicy
from opencomposer.harness.trajectory import Prices, Trajectory, write_jsonl
from opencomposer.tasks.task import Suite, Task, diff_excludes



class EvalOptions(Section):
    """Everything one evaluation run is made of (saved as run.json)."""

    suite: str
    """Suite directory."""
    policy: str
    """Policy spec (module docstring)."""
    label: str = ""
    """Name of the run in reports (default: the policy spec)."""
    passes: int = Field(1, ge=1)
    """Episodes per task (pass@k needs k <= passes)."""
    concurrency: int = Field(1, ge=1)
    """Episodes run at once."""
    task_timeout_s: float = Field(1800.0, gt=0)
    """Wall-clock limit of one episode (the agent's max_wall_s); the patch so far is still graded."""
    tasks: list[str] = ["*"]
    """Globs of task ids to run."""
    input_price_per_m: float = Field(0.0, ge=0)
    """USD per million input tokens (chat endpoints), for cost."""
    output_price_per_m: float = Field(0.0, ge=0)
    """USD per million output tokens."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the API key of openai: endpoints (None: no key)."""
    tokenizer: str | None = None
    """Tokenizer directory for token-level specs (default: the bundled tokenizer)."""
    device: DeviceName = "auto"
    """Where an engine: policy's model runs: auto (a GPU if torch sees one), cpu, cuda (opencomposer/device.py)."""
    agent: AgentConfig = AgentConfig()
    """The agent loop's limits and sampling (token-level specs); its wall-clock limit is task_timeout_s."""
    vllm: VLLMConfig = VLLMConfig()
    """The vLLM server a vllm:CKPT_DIR policy starts (dtype, KV cache, timeouts, ...)."""
    vllm_endpoint: Literal["chat", "tokens"] = "chat"
    """vllm:CKPT_DIR: the server's chat endpoint with the tool-call parser plugin, or token ids (/v1/completions)."""

    @model_validator(mode="after")
    def _no_wall_limit(self) -> "EvalOptions":
        _check_agent(self.agent)
        return self


def _check_agent(agent: AgentConfig) -> None:
    # run_episode replaces max_wall_s with task_timeout_s: another value would be silently ignored
    if agent.max_wall_s != AgentConfig.model_fields["max_wall_s"].default:
        raise ValueError("agent.max_wall_s: an evaluation sets it from task_timeout_s: set that instead")


EvalRunConfig = variant(RunConfig, "EvalRunConfig", drop=("seed", "num_threads"), out_dir=REQUIRED, describe={
    "out_dir": "Run directory (run.json, results, trajectories); rerun with the same one to resume.",
    "device": "Where an engine: policy's model runs: auto (a GPU if torch sees one), cpu, cuda."})


class EvalConfig(variant(EvalOptions, "EvalFields", drop=("device",))):
    """`opencomposer eval --config FILE`: EvalOptions, with the run directory and device in the shared `run` section."""

    run: EvalRunConfig
    """Run directory and device."""

    @model_validator(mode="after")
    def _no_wall_limit(self) -> "EvalConfig":
        _check_agent(self.agent)
        return self

    def options(self) -> EvalOptions:
        """What `evaluate` takes (and saves as run.json)."""
        fields = {k: getattr(self, k) for k in EvalOptions.model_fields if k != "device"}
        return EvalOptions(device=self.run.device, **fields)


# ----------------------------------------------------------------------------- policies

PolicyFactory = Callable[[Task], object]
"""Makes the policy for one task (shared clients are created once, outside)."""


def parse_policy(spec: str, options: EvalOptions, run_dir: Path | str = ".") -> PolicyFactory:
    """A policy spec "KIND[:REST]" -> a factory of policies (_POLICIES); ConfigError on a bad spec.
    A factory that holds a server has a `close()` (evaluate calls it at the end); `run_dir` is
    where such a server keeps its log."""
    kind, _, rest = spec.partition(":")
    make = _POLICIES.get(kind)
    factory = make(rest, options, Path(run_dir)) if make is not None else None
    if factory is None:
        raise ConfigError(f"unknown policy spec {spec!r}: use oracle, oracle:tests, noop, openai:MODEL@BASE_URL, "
                          "sglang:BASE_URL, vllm:MODEL@BASE_URL, vllm:CKPT_DIR or engine:CKPT_DIR")
    return factory


# Each takes the spec's REST and the options, and returns None when REST does not fit its kind.

def _oracle_policy(rest: str, options: EvalOptions, run_dir: Path) -> PolicyFactory | None:
    from opencomposer.tasks.policies import OraclePolicy

    return (lambda task: OraclePolicy(task, run_tests=rest == "tests")) if rest in ("", "tests") else None


def _noop_policy(rest: str, options: EvalOptions, run_dir: Path) -> PolicyFactory | None:
    from opencomposer.tasks.policies import NoOpPolicy

    if rest:
        return None
    policy = NoOpPolicy()
    return lambda task: policy


def _openai_policy(rest: str, options: EvalOptions, run_dir: Path) -> PolicyFactory | None:
    """openai:MODEL@BASE_URL: a chat-completions API (text in, text out; priced per token)."""
    from opencomposer.engine.client import OpenAIChatClient

    if "@" not in rest:
        return None
    prices = Prices(options.input_price_per_m, options.output_price_per_m)
    model, _, url = rest.partition("@")
    client = OpenAIChatClient(url, model, api_key_env=options.api_key_env,
                              input_price_per_m=prices.input_per_mtok, output_price_per_m=prices.output_per_mtok)
    policy = ChatClientPolicy(client, name=model, prices=prices, send_thinking=False)
    return lambda task: policy


def _sglang_policy(rest: str, options: EvalOptions, run_dir: Path) -> PolicyFactory | None:
    """sglang:BASE_URL: an SGLang-compatible server of token ids, with --tokenizer (else the bundled one)."""
    from opencomposer.engine.client import SGLangClient
    from opencomposer.model.tokenizer import load_tokenizer

    if not rest:
        return None
    tok = load_tokenizer(options.tokenizer)
    policy = TokenClientPolicy(SGLangClient(rest, tokenizer=tok), tok, name=rest, routed_experts=False)
    return lambda task: policy


def _vllm_policy(rest: str, options: EvalOptions, run_dir: Path) -> PolicyFactory | None:
    """vllm:MODEL@BASE_URL: a running vLLM server of token ids, with --tokenizer (else the bundled
    one); vllm:CKPT_DIR: a vLLM server started on the checkpoint (_managed_vllm_policy)."""
    from opencomposer.engine.client import VLLMClient
    from opencomposer.model.tokenizer import load_tokenizer

    if not rest:
        return None
    if "@" not in rest:
        if Path(rest).is_dir():
            return _managed_vllm_policy(Path(rest), options, run_dir)
        raise ConfigError(f"policy {'vllm:' + rest!r}: write vllm:CKPT_DIR (a checkpoint directory; {rest} is "
                          "not one) or vllm:MODEL@BASE_URL (a running server)")
    tok = load_tokenizer(options.tokenizer)
    name, _, url = rest.partition("@")
    policy = TokenClientPolicy(VLLMClient(url, name, tokenizer=tok), tok, name=name, routed_experts=False)
    return lambda task: policy


def _managed_vllm_policy(ckpt: Path, options: EvalOptions, run_dir: Path) -> PolicyFactory:
    """vllm:CKPT_DIR: start vLLM on the checkpoint (stopped by the factory's close()), then talk to
    its chat endpoint with the plugin (vllm_endpoint "chat") or to its token endpoint ("tokens").
    The server's context is the agent's context_window plus its max_new_tokens (the chat endpoint
    does not shorten a request to the room left), else the checkpoint's max_position_embeddings
    capped at 32k tokens (as engine:); the tokenizer is the checkpoint's (the served one). With
    `vllm.url` set the policy attaches to that server (started with --chat-tools for "chat")."""
    from opencomposer.engine.vllm_server import VLLMServer
    from opencomposer.engine.types import SamplingParams
    from opencomposer.model.hf import load_config
    from opencomposer.model.tokenizer import load_tokenizer

    if not (ckpt / "config.json").is_file():
        raise ConfigError(f"policy vllm:{ckpt}: no config.json there (an HF-format checkpoint directory)")
    if options.tokenizer is not None:
        raise ConfigError("tokenizer: a vllm:CKPT_DIR policy serves the checkpoint's own tokenizer; leave it unset")
    tok = load_tokenizer(checkpoint=ckpt)
    a, limit = options.agent, load_config(ckpt)[0].max_position_embeddings
    # the chat endpoint asks for max_new_tokens whatever the room left: leave it room past the window
    max_len = min(a.context_window + a.max_new_tokens, limit) if a.context_window else min(limit, 32_768)
    chat = options.vllm_endpoint == "chat"
    cfg = options.vllm.model_copy(update={"chat_tools": chat or options.vllm.chat_tools})
    server = VLLMServer(cfg, ckpt, log_dir=run_dir / "vllm", max_model_len=max_len)
    server.start()
    client = server.client(None if chat else tok)
    name = f"vllm:{ckpt.name}"
    if chat:
        sampling = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                                  max_new_tokens=a.max_new_tokens)
        policy = ChatClientPolicy(client, name=name, sampling=sampling, tokenizer=tok)
    else:
        policy = TokenClientPolicy(client, tok, name=name, routed_experts=False)

    def factory(task):
        return policy

    async def close() -> None:
        await client.aclose()
        await asyncio.to_thread(server.stop)

    factory.close = close
    return factory


def _engine_policy(path: str, options: EvalOptions, run_dir: Path) -> PolicyFactory | None:
    """engine:DIR: the embedded engine over an HF-format checkpoint, in this process, with
    one KV-cache slot per concurrent episode. Its context is the agent's context_window, else
    the model's max_position_embeddings capped at 32k tokens; the tokenizer is --tokenizer,
    else the checkpoint's tokenizer.json, else the bundled one (as `opencomposer serve`)."""
    from opencomposer.engine.client import InProcessClient
    from opencomposer.engine.engine import Engine
    from opencomposer.model import load_pretrained
    from opencomposer.model.export import check_tokenizer
    from opencomposer.model.tokenizer import load_tokenizer

    if not path:
        return None
    ckpt = Path(path)
    net = load_pretrained(ckpt, device=resolve_device(options.device))
    tok = load_tokenizer(options.tokenizer, checkpoint=ckpt)
    check_tokenizer(tok, net.config, ckpt)  # vocabulary size, the chat format's tokens
    max_len = options.agent.context_window or min(net.config.max_position_embeddings, 32_768)
    engine = Engine(net, max_slots=options.concurrency, max_len=max_len)
    policy = TokenClientPolicy(InProcessClient(engine, tok), tok, name=f"engine:{ckpt.name}", routed_experts=False)
    return lambda task: policy


_POLICIES: dict[str, Callable[[str, EvalOptions], PolicyFactory | None]] = {
    "oracle": _oracle_policy, "noop": _noop_policy, "openai": _openai_policy, "sglang": _sglang_policy,
    "vllm": _vllm_policy, "engine": _engine_policy,
}


# ----------------------------------------------------------------------------- one episode

async def run_episode(task: Task, pass_index: int, make_policy: PolicyFactory, options: EvalOptions,
                      out: Path, backend=None) -> tuple[Row, Trajectory | None]:
    """One task x pass: workspace, agent, diff, grade. Never raises for a task's own failure:
    an error becomes a Row with status "error" (and the trajectory so far, if any)."""
    from opencomposer.tasks.build import task_image
    from opencomposer.tasks.grade import grade
    from opencomposer.tasks.task import patch_stats

    traj_id = f"{task.id}__p{pass_index}"
    partial = out / PARTIAL / f"{traj_id}.json"
    row = Row(task.id, pass_index, traj_id, "error")
    traj: Trajectory | None = None
    ws = None
    try:
        image = await asyncio.to_thread(task_image, task, backend)
        ws = await asyncio.to_thread(image.workspace)
        config = options.agent.model_copy(update={"max_wall_s": options.task_timeout_s})
        agent = Agent(make_policy(task), ws, config, trajectory_id=traj_id, task_id=task.id, save_path=partial,
                      meta={"pass": pass_index, "suite": options.suite, "label": options.label or options.policy})
        traj = agent.trajectory
        t0 = time.monotonic()
        try:
            await agent.run(task.spec.instruction)
        finally:
            row.agent_s = round(time.monotonic() - t0, 3)
        traj.patch = await asyncio.to_thread(ws.diff, diff_excludes())
        result = await asyncio.to_thread(grade, task, traj.patch, backend=backend, image=image)
        traj.grade, traj.reward = result.to_json(), float(result.resolved)
        row.status, row.resolved, row.reward = "done", result.resolved, traj.reward
        row.f2p_passed, row.f2p_total, row.p2p_passed, row.p2p_total = (
            result.f2p_passed, result.f2p_total, result.p2p_passed, result.p2p_total)
        row.grade_reason, row.grade_s = result.reason, result.duration_s
        row.patch_lines = patch_stats(traj.patch)[0]
    except Exception as e:  # recorded, and retried on rerun; the other episodes go on
        row.error = f"{type(e).__name__}: {e}"
    finally:
        if ws is not None:
            await asyncio.to_thread(ws.close)
    if traj is not None:
        c = traj.counts
        row.stop_reason, row.turns, row.tool_calls = traj.stop_reason, c.turns, c.tool_calls
        row.prompt_tokens, row.completion_tokens, row.cost_usd = c.prompt_tokens, c.completion_tokens, traj.cost_usd
        row.error = row.error or traj.error
    return row, traj


# ----------------------------------------------------------------------------- the run

def _check_resume(out: Path, options: EvalOptions) -> None:
    run = out / RUN
    if not run.is_file():
        return
    old = json.loads(run.read_text())
    for key in ("suite", "policy"):
        if old.get(key) != getattr(options, key):
            raise ConfigError(f"{out} already holds a run with {key}={old.get(key)!r} (this one: "
                              f"{getattr(options, key)!r}); choose another --out to start a new run")


async def evaluate(options: EvalOptions, out: Path | str, *, backend=None, progress: bool = True) -> dict:
    """Run the evaluation into `out` (see the module docstring); returns results.json's content."""
    out = Path(out)
    suite = Suite.load(options.suite)
    tasks = [t for t in suite.tasks if any(fnmatch.fnmatch(t.id, g) for g in options.tasks)]
    if not tasks:
        raise ConfigError(f"no task of {options.suite} matches {options.tasks}")
    _check_resume(out, options)
    out.mkdir(parents=True, exist_ok=True)
    make_policy = await asyncio.to_thread(parse_policy, options.policy, options, out)
    try:
        return await _evaluate(options, out, suite, tasks, make_policy, backend, progress)
    finally:
        close = getattr(make_policy, "close", None)
        if close is not None:
            await close()


async def _evaluate(options: EvalOptions, out: Path, suite: Suite, tasks: list[Task], make_policy: PolicyFactory,
                    backend, progress: bool) -> dict:
    info = {**options.model_dump(mode="json"), "label": options.label or options.policy,
            "suite_name": suite.spec.name, "suite_version": suite.spec.version, "started_at": time.time()}
    if not (out / RUN).is_file():
        (out / RUN).write_text(json.dumps(info, indent=2))
    done = {(r.task_id, r.pass_index) for r in read_rows(out) if r.status == "done"}
    todo = [(t, p) for p in range(options.passes) for t in tasks if (t.id, p) not in done]

    sem = asyncio.Semaphore(options.concurrency)
    lock = asyncio.Lock()
    bar = _Progress(len(todo), f"{info['label']} on {suite.spec.name}", enabled=progress)

    async def one(task: Task, p: int) -> None:
        async with sem:
            row, traj = await run_episode(task, p, make_policy, options, out, backend)
        async with lock:  # one writer: whole lines, trajectory before its row
            if traj is not None and row.status == "done":
                write_jsonl([traj], out / TRAJECTORIES)
                for f in (out / PARTIAL).glob(f"{traj.id}.json*"):
                    f.unlink()
            with open(out / RESULTS, "a") as f:
                f.write(json.dumps(asdict(row)) + "\n")
            bar.advance(row)

    with bar:
        await asyncio.gather(*(one(t, p) for t, p in todo))
    rows = [r for r in read_rows(out) if r.task_id in {t.id for t in tasks}]
    result = {**json.loads((out / RUN).read_text()), "finished_at": time.time(),
              "summary": summarize([asdict(r) for r in rows]), "rows": [asdict(r) for r in rows]}
    (out / SUMMARY).write_text(json.dumps(result, indent=2))
    return result


class _Progress:
    """A rich progress bar with the running accuracy (silent when disabled)."""

    def __init__(self, total: int, title: str, enabled: bool):
        self.total, self.title, self.enabled = total, title, enabled
        self.resolved = self.finished = self.errors = 0
        self._p = self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[status]}"), TimeElapsedColumn())
            self._p.__enter__()
            self._task = self._p.add_task(self.title, total=self.total, status="")
        return self

    def advance(self, row: Row) -> None:
        self.finished += 1
        self.resolved += row.resolved
        self.errors += row.status != "done"
        if self._p is not None:
            status = f"resolved {self.resolved}/{self.finished}" + (f", {self.errors} errors" if self.errors else "")
            self._p.update(self._task, advance=1, status=status)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)
