"""Runs the cells of one sandbox call, unprivileged, inside the namespaces set up by `_sandbox_init`.

The job arrives as JSON on stdin: {"cells": [...], "seed": int, "cell_cpu_seconds": int,
"echo_last_expression": bool, "site_dirs": [...] or null}. All cells run in one globals dict, in
order. Every cell but the last is a replay of the tool's earlier turns: its output (Python-level
and fd-level, so subprocesses too) goes to /dev/null. The last cell is the one the agent sees: its
stdout/stderr are the sandbox's.
Before the first cell the runner writes {"from": "runner", "kind": "ready"} to fd 3 (start-up is
over); after each cell one JSON line goes there for the host's bookkeeping: {"kind": "cell", "index",
"error", "memory_error", "wall_seconds", "cpu_seconds"}. The code runs in this process and can write
fd 3 too, so the host believes none of it: it times the cells by its own clock as it reads the
lines, bounds the CPU figures by the init's measurement, and voids a call whose lines are not
exactly these records, in order (see "Accounting" in `trace_core.envs.sandbox.reports`).

Stdlib only at start-up; `random` is seeded so replayed cells draw the same numbers.
"""

import ast
import builtins
import json
import math
import os
import random
import resource
import sys
import time


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _compile_cell(source: str, index: int, echo_last: bool):
    """Returns (body, last_expression) code objects; the expression is echoed like a notebook does."""
    name = f"<cell {index}>"
    tree = ast.parse(source, filename=name, mode="exec")
    last = None
    if echo_last and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), name, "eval")
    return compile(tree, name, "exec"), last


def _write_stderr(text: str) -> None:
    try:
        sys.stderr.write(text)
    except BaseException:  # noqa: BLE001 - a broken stderr must not hide the record
        pass


def _format_exception(exc: BaseException) -> str:
    import traceback  # only on errors: ~5 ms of start-up saved per call

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # hide the runner's own frames: the agent sees only its cells
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _add_site_dirs(dirs: list[str] | None) -> None:
    """Started with -S: put the venv's site-packages on sys.path without running their .pth files."""
    if dirs is None:
        return
    import site

    sys.path.extend(d for d in dirs if d not in sys.path)
    site.setquit()  # exit() and quit(), which model code calls
    site.sethelper()


def main() -> None:
    job = json.loads(sys.stdin.read())
    _add_site_dirs(job.get("site_dirs"))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.set_inheritable(3, False)  # subprocesses of the code do not get the status channel
    status = os.fdopen(3, "w", buffering=1)
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.set_inheritable(saved_out, False)
    os.set_inheritable(saved_err, False)
    random.seed(job["seed"])
    # Ends start-up for the host's clocks; written before any cell, so no code can have forged it.
    status.write('{"from": "runner", "kind": "ready"}\n')
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    cells = job["cells"]
    for index, source in enumerate(cells):
        visible = index == len(cells) - 1
        sys.stdout.flush()
        sys.stderr.flush()
        if visible:
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            budget = math.ceil(_cpu_used()) + int(job["cell_cpu_seconds"])
            if hard != resource.RLIM_INFINITY:
                budget = min(budget, hard)
            resource.setrlimit(resource.RLIMIT_CPU, (budget, hard))
        else:
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        t0, c0 = time.perf_counter(), _cpu_used()
        error, memory_error = None, False
        try:
            body, last = _compile_cell(source, index, bool(job["echo_last_expression"]))
            exec(body, namespace)
            if last is not None:
                value = eval(last, namespace)
                if value is not None:
                    print(repr(value))
        except SystemExit as exc:  # exit() ends the cell, not the tool; a non-zero code is an error
            if exc.code not in (None, 0):
                error = f"SystemExit: {exc.code}"[:500]
                _write_stderr(error + "\n")
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt etc. are cell errors too
            error = f"{type(exc).__name__}: {exc}"[:500]
            memory_error = isinstance(exc, MemoryError)
            _write_stderr(_format_exception(exc))
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        record = {
            "from": "runner",
            "kind": "cell",
            "index": index,
            "error": error,
            "memory_error": memory_error,
            "wall_seconds": time.perf_counter() - t0,
            "cpu_seconds": _cpu_used() - c0,
        }
        status.write(json.dumps(record) + "\n")
    # End now: threads the code left running would otherwise keep the interpreter alive until the
    # wall clock, and turn a finished cell into a stopped one.
    os._exit(0)


if __name__ == "__main__":
    main()
