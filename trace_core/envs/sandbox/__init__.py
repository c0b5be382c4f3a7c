"""A sandbox for model-written Python, and the stateful `python` tool built on it.

Each call runs in fresh Linux namespaces that vanish with it: no network, a read-only view of the
host, a private /tmp, an unprivileged uid and rlimits. The host keeps the wall clock, the output cap
and the accounting, and believes nothing the code could have written. Where that isolation cannot
be set up, `PythonSandbox` raises `SandboxUnavailableError` instead of running anything unconfined.

Modules, from the bottom up:
- `config`: `SandboxConfig` (a call's limits and identity), `SandboxResult` (what the host observed
  of a call) and `SandboxUnavailableError`;
- `confinement`: what a cell is confined to, and what each layer guarantees (the process chain and
  its namespaces, the read-only view of the interpreter, the uid pool, the environment);
- `reports`: the runner's report channel, parsed defensively, and the accounting the code cannot
  inflate;
- `processes`: the init's status records, and stopping a sandbox so that nothing of it is left;
- `python_sandbox`: `PythonSandbox`, which starts a call, feeds it, keeps its clocks and caps and
  makes a `SandboxResult` of what it saw (with the self-test at construction), and `run_python`;
- `tool_session`: `PythonToolSession`, the `python` tool whose variables persist across turns by
  replay, and `ToolSnapshot`, its state as plain data.
Two scripts run inside the namespaces, stdlib only and started by path: `_sandbox_init.py` (PID 1,
root: the mounts, then the uid drop) and `_sandbox_runner.py` (the cells, unprivileged).
"""

from __future__ import annotations

from trace_core.envs.sandbox.config import SandboxConfig, SandboxResult, SandboxUnavailableError
from trace_core.envs.sandbox.python_sandbox import PythonSandbox, run_python
from trace_core.envs.sandbox.tool_session import PythonToolSession, ToolSnapshot

__all__ = [
    "PythonSandbox",
    "PythonToolSession",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailableError",
    "ToolSnapshot",
    "run_python",
]
