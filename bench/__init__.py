"""The benchmarks: each runs from the repository root as ``python -m bench.<name>`` (its ``--help``
says what it measures and how).

Importing this package sets the environment defaults they share. ``python -m bench.<name>``
imports the package before the benchmark's own module, so these are in place before numpy or
torch loads; a variable already set in the environment wins.
"""

import os

# One BLAS/OpenMP thread: the benchmarks time small arrays and single-threaded work on a shared
# 2-core machine, where more threads only add overhead and let other load distort the timings;
# the learning runs are made this way too. A run that wants more sets the variables itself.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# the ones set here rather than by the caller: a benchmark that times a command as users run it
# (bench.main_job) takes them out again for the processes it starts
THREADS_DEFAULTED = tuple(v for v in THREAD_VARIABLES if v not in os.environ)
for _var in THREADS_DEFAULTED:
    os.environ[_var] = "1"


def use_every_core() -> None:
    """For a benchmark that is the machine's one heavy job (the real policy's measurements and its
    learning runs, where vLLM's generation and the policy update take hours): the thread variables
    this package set to 1 are set to the machine's core count (one a caller set stays). Call it
    before numpy or torch is imported: both read the variables when they load."""
    for var in THREADS_DEFAULTED:
        os.environ[var] = str(os.cpu_count() or 1)

# Offline: every model, tokenizer and index a benchmark loads is built here or committed; nothing
# is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# vLLM's CPU backend would size its KV cache from this variable, overriding
# EngineConfig.kv_cache_bytes; nothing else reads it, so dropping it is harmless for the
# benchmarks without vLLM.
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)

# DS_ACCELERATOR=cpu is not set here: the GPU check (gpu_check_stages) runs DeepSpeed on CUDA.
# The CPU training benchmarks set it themselves before they load DeepSpeed.
