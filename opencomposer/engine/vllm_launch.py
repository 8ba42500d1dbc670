"""The process vLLM runs under: a watchdog that ends vLLM's whole process group with its owner.

    <vllm venv>/bin/python vllm_launch.py OWNER_PID -- ARGV...

Started by `VLLMServer` (vllm_server.py) as the leader of a new session, it starts ARGV (vLLM's
API server) as its child in the same process group, then waits. It kills the group (vLLM's
API server and every engine process it forked) with SIGKILL when:

- the owner dies (crash, SIGKILL, OOM: its parent pid changes, checked every 0.2 s), so no vLLM
  outlives the run that started it;
- vLLM's API server exits (its engine processes could linger otherwise); the watchdog exits
  with the server's code (128 + signal when killed by one);
- it gets SIGTERM or SIGINT (VLLMServer.stop sends SIGTERM to the group: vLLM's own shutdown
  runs first, then the group is killed after a grace period by VLLMServer).

Standard library only: it runs in vLLM's venv, where opencomposer's dependencies are absent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: vllm_launch.py OWNER_PID -- ARGV...", file=sys.stderr)
        return 2
    owner, cmd = int(argv[0]), argv[2:]
    child = subprocess.Popen(cmd)  # inherits our process group (we are its leader)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        code = child.poll()
        if code is not None:
            break
        if os.getppid() != owner:  # the owner is gone: take vLLM with it
            print(f"vllm_launch: owner {owner} exited; killing vLLM's process group", file=sys.stderr, flush=True)
            os.killpg(0, signal.SIGKILL)
        time.sleep(0.2)
    rc = code if code >= 0 else 128 - code
    print(f"vllm_launch: vLLM's API server exited with {rc}{' (stopped)' if stopping else ''}", file=sys.stderr,
          flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGKILL)  # its engine processes; this process goes with them
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
