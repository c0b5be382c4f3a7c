"""Kubeflow Pipelines components of trace-rl: one file per component, each a typed function
(parameters and artifacts) that calls :mod:`trace_core` and logs to MLflow through
:mod:`trace_core.tracking`.

Component bodies import only ``trace_core`` (installed in the images) and the standard library,
because KFP ships a lightweight component's function source alone. Their image is the pinned
CPU image of ``infra/images/kustomization.yaml``; the pipeline moves train/evaluate to the CUDA
image when they get GPUs (``pipelines/platform.py``). No file here may use
``from __future__ import annotations``: KFP reads the annotations as types.

Every component takes ``workspace`` and ``reuse``: finished results are kept under
``<workspace>/<stage>/<fingerprint>/`` (:class:`trace_core.lineage.StageCache`) and a rerun with
unchanged inputs and settings copies them instead of recomputing (``kfp.local`` has no cache).
"""

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # infra/ is a namespace package at the repository root
    sys.path.insert(0, str(_REPO))

from infra.build_images import load_images  # noqa: E402

IMAGES = load_images()
CPU_IMAGE = IMAGES["trace-rl-cpu"]
GPU_IMAGE = IMAGES["trace-rl-cuda"]
