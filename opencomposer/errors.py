"""The project's named exceptions: each message tells the user what to do next.

Bad input from a *model* (a tool call) is never raised out of the harness: it becomes a
tool error returned to the model. These exceptions are for users and operators: bad
configs, missing system packages, broken checkpoints.
"""


class OpenComposerError(Exception):
    """Base class: every error the project raises on purpose."""


class ConfigError(OpenComposerError):
    """A config file or option is invalid; the message names the field and the fix."""


class SetupError(OpenComposerError):
    """A system dependency is missing (bwrap, ripgrep, runsc...); the message says how to install it."""


class SandboxError(OpenComposerError):
    """A sandbox could not be created, mounted or cleaned up."""


class CheckpointError(OpenComposerError):
    """A directory is not a valid checkpoint, or its tensors do not match its config."""


class TaskError(OpenComposerError):
    """A task or suite directory is malformed, or a task image cannot be built; the message names the file and field."""


class MessageError(OpenComposerError, ValueError):
    """A chat message from a user or API client is malformed (unknown role, wrong field type)."""


class InferenceError(OpenComposerError):
    """An inference server or engine refused a request (the message carries its reason) or
    could not be reached after retries; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status
