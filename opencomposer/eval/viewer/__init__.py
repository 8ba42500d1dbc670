"""The static trajectory viewer: self-contained HTML pages, rendered and escaped in Python.

Pages: one index per run (a filterable table of its trajectories) and one page per
trajectory (header with reward and counts; the grade; the patch as a coloured diff; then
every segment's messages: system prompt, task and tool results collapsed, thinking
collapsed, tool calls with their arguments, malformed calls with their raw text and error,
the summary that closed a segment). Every page inlines `style.css` and `viewer.js` (in
this directory) into `page.html`; nothing is fetched, so a page works from disk, a CI
artifact or an e-mail.

Trajectories hold untrusted model output (a model may write `<script>` into a file and read
it back). Two defences: every string from a trajectory goes through `html.escape` (text
and attributes; data never enters a script or a URL), and each page carries a
Content-Security-Policy that allows only its own inline script and style, by sha256 hash,
so a script that slipped through escaping would still not run.
tests/eval/test_report.py opens a page holding a `<script>` in a tool output in headless
Chromium and checks the script is shown as text and never ran.

Left out: syntax highlighting, search across runs, side-by-side comparison of two runs.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Iterable

HERE = Path(__file__).parent


def esc(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


@lru_cache(maxsize=1)
def _assets() -> tuple[Template, str, str]:
    return (Template((HERE / "page.html").read_text()), (HERE / "style.css").read_text(),
            (HERE / "viewer.js").read_text())


def _csp_hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def page(title: str, body: str, nav: Iterable[tuple[str, str]] = ()) -> str:
    """A whole page; `body` must already be escaped HTML; nav holds (href, label) pairs."""
    template, style, script = _assets()
    links = " ".join(f'<a href="{esc(href)}">{esc(label)}</a>' for href, label in nav)
    return template.substitute(title=esc(title), style=style, script=script, nav=links, body=body,
                               style_hash=_csp_hash(style), script_hash=_csp_hash(script))


def table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table; cells must already be escaped HTML."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def verdict(resolved) -> str:
    if resolved is None:
        return '<span class="muted">not graded</span>'
    return '<span class="ok">resolved</span>' if resolved else '<span class="bad">unresolved</span>'


def diff_html(patch: str) -> str:
    """A unified diff with its lines classed (file headers, hunks, additions, deletions)."""
    if not patch:
        return '<p class="muted">No changes.</p>'
    out = []
    for line in patch.splitlines():
        cls = ("file" if line.startswith(("diff --git", "+++ ", "--- ")) else "hunk" if line.startswith("@@")
               else "add" if line.startswith("+") else "del" if line.startswith("-") else "")
        out.append(f'<span class="{cls}">{esc(line)}</span>' if cls else esc(line))
    return '<pre class="diff">' + "\n".join(out) + "</pre>"


def _pre(text) -> str:
    return f"<pre>{esc(text)}</pre>"


def _first_line(text: str, n: int = 90) -> str:
    line = (text or "").strip().split("\n", 1)[0]
    return line[:n] + ("…" if len(line) > n else "")


def _call_html(call: dict) -> str:
    fn = call.get("function", {})
    name, args = fn.get("name", ""), fn.get("arguments", "")
    if call.get("error"):
        return (f'<details class="call malformed" open><summary>malformed tool call: {esc(call["error"])}</summary>'
                f'{_pre(call.get("raw", ""))}</details>')
    try:
        parsed = json.loads(args) if args else {}
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        preview = ", ".join(f"{k}={_first_line(json.dumps(v, ensure_ascii=False), 40)}" for k, v in parsed.items())
        body = "".join(f'<div class="muted">{esc(k)}</div>{_pre(v if isinstance(v, str) else json.dumps(v, indent=2))}'
                       for k, v in parsed.items())
    else:
        preview, body = "(arguments are not a JSON object)", _pre(args)
    return (f'<details class="call" open><summary><code>{esc(name)}</code>({esc(preview)})</summary>'
            f"{body}</details>")


def message_html(m: dict) -> str:
    role, content = m.get("role", ""), m.get("content") or ""
    if role == "system":
        return f'<div class="msg system"><details><summary>system prompt</summary>{_pre(content)}</details></div>'
    if role == "tool":
        error = content.startswith("Error:")
        cls = "msg tool error" if error else "msg tool"
        return (f'<div class="{cls}"><details><summary>{"error from" if error else "result of"} '
                f'<code>{esc(m.get("name"))}</code>: {esc(_first_line(content))} '
                f'<span class="muted">({len(content):,} chars)</span></summary>{_pre(content)}</details></div>')
    parts = [f'<div class="role">{esc(role)}</div>']
    if m.get("reasoning_content"):
        thinking = m["reasoning_content"]
        parts.append(f"<details><summary>thinking ({len(thinking):,} chars)</summary>{_pre(thinking)}</details>")
    if content:
        parts.append(_pre(content))
    parts += [_call_html(c) for c in m.get("tool_calls") or []]
    return f'<div class="msg {esc(role)}">{"".join(parts)}</div>'


def _kv(items: list[tuple[str, object]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def trajectory_page(t: dict, nav: list[tuple[str, str]]) -> str:
    """One trajectory (a `Trajectory.to_dict()`) as a page."""
    c = t.get("counts", {})
    grade = t.get("grade") or {}
    head = _kv([
        ("task", esc(t.get("task_id"))), ("policy", esc(t.get("policy"))),
        ("verdict", verdict(grade.get("resolved") if grade else None)), ("reward", esc(t.get("reward"))),
        ("stop reason", esc(t.get("stop_reason")) + (f' <span class="bad">{esc(t.get("error"))}</span>'
                                                     if t.get("error") else "")),
        ("turns", esc(c.get("turns"))), ("tool calls", esc(f'{c.get("tool_calls")} ({c.get("tool_errors")} errors, '
                                                            f'{c.get("malformed_calls")} malformed)')),
        ("tokens", esc(f'{c.get("prompt_tokens"):,} in, {c.get("completion_tokens"):,} out '
                       f'({c.get("thinking_tokens"):,} thinking)')),
        ("summaries", esc(c.get("summaries"))), ("cost", esc(f'${t.get("cost_usd", 0):.4f}')),
        ("wall time", esc(f'{t.get("wall_s", 0):.1f} s (policy {t.get("policy_s", 0):.1f} s, '
                          f'tools {t.get("tools_s", 0):.1f} s)')),
    ])
    body = [f"<h1>{esc(t.get('id'))}</h1>", head, "<h2>Task</h2>", _pre(t.get("instruction"))]
    if grade:
        tests = grade.get("tests", {})
        rows = [[esc(k), f'<span class="{"ok" if v == "passed" else "bad"}">{esc(v)}</span>'] for k, v in tests.items()]
        body += ["<h2>Grade</h2>", _kv([
            ("fail-to-pass", esc(f'{grade.get("f2p_passed")}/{grade.get("f2p_total")}')),
            ("pass-to-pass", esc(f'{grade.get("p2p_passed")}/{grade.get("p2p_total")}')),
            ("reason", esc(grade.get("reason") or "-"))]),
            table(["test", "outcome"], rows),
            f'<details><summary>test log</summary>{_pre(grade.get("log", ""))}</details>']
    if t.get("patch") is not None:
        body += ["<h2>Patch</h2>", diff_html(t["patch"])]
    if t.get("final_message") is not None:
        body += ["<h2>Final message</h2>", _pre(t["final_message"])]
    body.append('<h2>Conversation</h2><div class="toolbar"><button id="expand-all">expand all</button>'
                '<button id="collapse-all">collapse all</button></div>')
    for i, seg in enumerate(t.get("segments", [])):
        n_tokens = f", {len(seg['token_ids']):,} tokens" if seg.get("token_ids") is not None else ""
        body.append(f'<div class="segment"><div class="muted">context {i + 1}{esc(n_tokens)}</div>')
        body += [message_html(m) for m in seg.get("messages", [])]
        if seg.get("summary") is not None:
            body.append('<p class="muted">The context was replaced by the summary above.</p>')
        body.append("</div>")
    return page(f"{t.get('id')}: trajectory", "\n".join(body), nav)
