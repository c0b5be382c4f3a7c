"""Multi-benchmark evaluation of a policy checkpoint (method §9), through the training agent loop.

    benchmarks.py  the known benchmarks (paper + embedded), BenchmarkConfig, loading from files
    config.py      EvalConfig: benchmarks, k samples, greedy, per-family agent limits, engine, tracking
    runner.py      evaluate(checkpoint_dir, config, engine=None, tracker=None) -> EvalResult
    metrics.py     pure metric functions: unbiased pass@k, pass@1 averaged over k, domain averages
    success.py     measure_success: k bare rollouts per task -> successes (every success-rate figure's one measurement)
    report.py      EvalResult, comparison_table (the paper's main-table layout), summary, MLflow logging
    __main__.py    CLI: python -m trace_core.evaluation --checkpoint DIR --benchmarks math,qa,fc

The untrained ReAct baseline is the evaluation of the initial checkpoint (the policy RL starts
from): ``python -m trace_core.evaluation --checkpoint runs/warm/policy --name react-baseline``.

Importing this package is cheap: engines, transformers and the environments' heavy resources are
loaded by :func:`evaluate` when it runs.
"""

from trace_core.evaluation.benchmarks import (
    FAMILY_DEFAULTS,
    KNOWN_BENCHMARKS,
    Benchmark,
    BenchmarkConfig,
    KnownBenchmark,
    benchmark_list,
    load_benchmarks,
)
from trace_core.evaluation.config import EvalConfig, EvalEngineSettings, FamilyAgents
from trace_core.evaluation.metrics import domain_averages, mean_pass_at_k, pass_at_1_avg, pass_at_k
from trace_core.evaluation.report import (
    BenchmarkResult,
    EvalResult,
    comparison_table,
    detail_table,
    log_result,
    summary_markdown,
)
from trace_core.evaluation.runner import evaluate

__all__ = [
    "FAMILY_DEFAULTS",
    "KNOWN_BENCHMARKS",
    "Benchmark",
    "BenchmarkConfig",
    "BenchmarkResult",
    "EvalConfig",
    "EvalEngineSettings",
    "EvalResult",
    "FamilyAgents",
    "KnownBenchmark",
    "benchmark_list",
    "comparison_table",
    "detail_table",
    "domain_averages",
    "evaluate",
    "load_benchmarks",
    "log_result",
    "mean_pass_at_k",
    "pass_at_1_avg",
    "pass_at_k",
    "summary_markdown",
]
