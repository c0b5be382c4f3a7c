"""Figures logged at the end of a run: effective ratio and Spearman over training, allocation."""

from __future__ import annotations

from typing import Any

import numpy as np


def training_plots(history: dict[str, list[float]]) -> dict[str, Any]:
    """Matplotlib figures keyed by name, from the per-step metric history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs: dict[str, Any] = {}
    if not history:
        return figs
    steps = np.arange(len(next(iter(history.values()))))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in ("effective_ratio", "prefix_effective_ratio"):
        if key in history:
            ax.plot(steps, history[key], marker="o", label=key)
    ax.set(xlabel="step", ylabel="ratio", ylim=(0, 1.05), title="Effective ratios")
    ax.legend()
    figs["effective_ratio"] = fig

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in ("predictor/oos_spearman_root", "predictor/oos_spearman_prefix"):
        if key in history:
            ax.plot(steps, history[key], marker="o", label=key.split("/")[-1])
    ax.set(xlabel="step", ylabel="Spearman", ylim=(-1, 1), title="Predictor (out of sample)")
    ax.legend()
    figs["predictor_spearman"] = fig

    bins = sorted(k for k in history if k.startswith("alloc/k_position_bin"))
    if bins:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        totals = [float(np.nansum(history[b])) for b in bins]
        edges = np.linspace(0, 1, len(bins) + 1)
        ax.bar([f"{edges[i]:.1f}-{edges[i + 1]:.1f}" for i in range(len(bins))], totals)
        ax.set(xlabel="relative turn position t/T", ylabel="continuations K", title="Prefix budget by position")
        figs["k_by_position"] = fig
    return figs


def comparison_plots(histories: dict[str, dict[str, list[float]]],
                     allocations: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Figures that compare methods: the effective ratio per step per method, and for each method
    whose root rule varies ``m_i`` (given in ``allocations``: each step's record with ``m``) the
    histogram of ``m_i`` and the continuations ``K`` by relative turn position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs: dict[str, Any] = {}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for method, history in histories.items():
        ratio = history.get("effective_ratio", [])
        ax.plot(np.arange(len(ratio)), ratio, marker="o", label=method)
    ax.set(xlabel="step", ylabel="effective ratio", ylim=(0, 1.05),
           title="Share of activated prompts with a mixed group")
    ax.legend()
    fig.tight_layout()
    figs["effective_ratio_per_step"] = fig
    for method, records in allocations.items():
        if not records:
            continue
        m = np.concatenate([np.asarray(r["m"], dtype=np.int64) for r in records])
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
        counts = np.bincount(m)
        left.bar(np.arange(counts.size), counts)
        left.set(xlabel="m_i (bare rollouts given to a candidate prompt)", ylabel="prompts",
                 title=f"{method}: root allocation ({100 * np.mean(m == 0):.0f}% skipped)")
        k = np.sum([np.asarray(r.get("k_by_position", []), dtype=np.int64) for r in records], axis=0)
        edges = np.linspace(0, 1, k.size + 1) if np.size(k) else np.zeros(1)
        right.bar([f"{edges[i]:.1f}-{edges[i + 1]:.1f}" for i in range(np.size(k))], np.atleast_1d(k))
        right.set(xlabel="relative turn position t/T", ylabel="continuations K", title=f"{method}: prefix budget")
        fig.tight_layout()
        figs[f"{method}_allocation"] = fig
    return figs
