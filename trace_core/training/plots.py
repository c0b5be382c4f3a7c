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
