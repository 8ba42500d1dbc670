"""run_terminal_cmd: one shell command in the workspace's sandbox, with a timeout and output caps.

The command runs through `workspace.aexec` (bash -lc, cwd /workspace) under the config's
`terminal_limits` with the call's timeout. Each of stdout and stderr keeps its first
`terminal_head_bytes` and last `terminal_tail_bytes` (compiler errors sit at the start,
test summaries at the end) with an "... N bytes omitted ..." marker between.

A non-zero exit code is a normal result (ok=True, the code is in the output): failing tests
are information for the agent, not a misuse of the tool. A timeout or an out-of-memory
kill is a failed call (ok=False, error_kind "timeout" / "oom") that still shows the output.

A command line is at most `MAX_COMMAND_BYTES` (the kernel takes at most 128 KiB per
argument); longer scripts go into a file with write_file first.

Left out: background processes (everything an exec starts is gone when it returns),
interactive stdin.
"""

from __future__ import annotations

import dataclasses

from opencomposer.harness.tools.base import ToolError, ToolSpec, params, printable

MAX_COMMAND_BYTES = 100_000

def head_tail(text: str, head: int, tail: int) -> str:
    """Keep the first `head` and last `tail` bytes of text (UTF-8), marking what was cut."""
    data = text.encode("utf-8")
    if len(data) <= head + tail:
        return text
    omitted = len(data) - head - tail
    start = data[:head].decode("utf-8", errors="ignore")
    end = data[len(data) - tail:].decode("utf-8", errors="ignore")
    return f"{start}\n... {omitted:,} bytes omitted ...\n{end}"


def format_exec(result, head: int, tail: int) -> str:
    """The model-facing text of an ExecResult."""
    code = "none (killed)" if result.exit_code is None else str(result.exit_code)
    out = [f"exit code: {code}"]
    # printable first: a backend may hand over undecodable bytes as surrogates, which UTF-8 cannot cut
    if result.stdout:
        out.append("--- stdout ---\n" + head_tail(printable(result.stdout), head, tail).rstrip("\n"))
    if result.stderr:
        out.append("--- stderr ---\n" + head_tail(printable(result.stderr), head, tail).rstrip("\n"))
    if not result.stdout and not result.stderr:
        out.append("(no output)")
    if result.output_truncated:
        out.append("[the sandbox cut the output at its size limit]")
    return "\n".join(out)


async def run_terminal_cmd(box, args: dict) -> str:
    cfg = box.config
    command = args["command"]
    if not command.strip():
        raise ToolError("invalid_arguments", "argument 'command' is empty")
    if (size := len(command.encode("utf-8"))) > MAX_COMMAND_BYTES:
        raise ToolError("invalid_arguments", f"the command is {size:,} bytes, over the {MAX_COMMAND_BYTES:,}-byte "
                        "limit of a command line; write the script to a file with write_file and run that")
    timeout = args.get("timeout_s", cfg.terminal_timeout_s)
    if timeout > cfg.terminal_max_timeout_s:
        raise ToolError("invalid_arguments",
                        f"timeout_s={timeout:g} is over the maximum of {cfg.terminal_max_timeout_s:g} s")
    limits = dataclasses.replace(cfg.terminal_limits, timeout_s=float(timeout))
    result = await box.workspace.aexec(command, limits=limits)
    text = format_exec(result, cfg.terminal_head_bytes, cfg.terminal_tail_bytes)
    if result.timed_out:
        raise ToolError("timeout", f"the command timed out after {timeout:g} s and was killed with all its "
                        "processes; run something shorter or raise timeout_s", output=text)
    if result.oom_killed:
        raise ToolError("oom", f"the command ran out of memory ({limits.memory_mb} MB limit) and was killed",
                        output=text)
    return text


TERMINAL_TOOL = ToolSpec(
    "run_terminal_cmd",
    "Run a bash command in the workspace's sandbox (cwd /workspace, no network unless configured) "
    "and return its exit code, stdout and stderr. Long output keeps its start and end. Processes "
    "do not outlive the command.",
    params(["command"],
           command={"type": "string", "description": "The bash command line."},
           timeout_s={"type": "number", "minimum": 1, "description": "Seconds before the command is killed (default 120)."}),
    run_terminal_cmd)
