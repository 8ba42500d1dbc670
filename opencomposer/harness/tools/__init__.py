"""The agent's IDE tools, run against a sandbox workspace.

`ToolBox(workspace, config)` exposes `schemas()` (OpenAI function-calling schemas), `run`,
`run_many` and `call`. The tools: read_file, edit_file, write_file, delete_file, list_dir,
glob (files.py, globs.py; host-side, confined by paths.py), grep and run_terminal_cmd
(grep.py, terminal.py; in the workspace's sandbox), codebase_search (../search.py; host-side,
descriptor-based walk), todo (todo.py).
"""

from opencomposer.harness.tools.base import ERROR_KINDS, ToolCall, ToolConfig, ToolError, ToolResult, ToolStats
from opencomposer.harness.tools.box import TOOLS, ToolBox

__all__ = ["ERROR_KINDS", "TOOLS", "ToolBox", "ToolCall", "ToolConfig", "ToolError", "ToolResult", "ToolStats"]
