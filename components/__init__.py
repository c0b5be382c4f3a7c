"""Kubeflow Pipelines components of trace-rl: one file per component, each a typed function
(parameters and artifacts) that unpacks its artifacts into typed values and calls its step in
:mod:`pipelines.steps` (or the library directly); the steps call :mod:`trace_core` and log to
MLflow through :mod:`trace_core.tracking`.

KFP ships a lightweight component's function source alone (read from this real file), so every
import is inside the body: the standard library, ``trace_core`` (installed in the images) and
``pipelines``. The task runs ``python3 -m kfp.dsl.executor_main`` in its working directory, which
``-m`` puts on ``sys.path``: the repository root locally (``kfp.local``'s subprocesses inherit it)
and the image's source checkout (its ``WORKDIR``) on a cluster, so ``pipelines`` imports in both.
Their image is the pinned CPU image of ``infra/images/kustomization.yaml``; the pipeline moves
train/evaluate to the CUDA image when they get GPUs (``pipelines/platform.py``). No file here may
use ``from __future__ import annotations``: KFP reads the annotations as types.

Every component takes ``workspace`` and ``reuse``: finished results are kept under
``<workspace>/<stage>/<fingerprint>/`` (:class:`pipelines.lineage.StageCache`) and a rerun with
unchanged inputs and settings copies them instead of recomputing (``kfp.local`` has no cache).

The DAG never imports these functions: it loads their compiled specs from ``components/specs/``
(``python -m components.specs`` writes them; a test checks they match), so ``pipelines`` does not
depend on this package.

Importing this package needs the repository root on ``sys.path`` (``infra/`` is a namespace
package there), as every entry point has it: ``python -m pipelines`` and ``python -m pytest``
run from the root.
"""

from infra.build_images import load_images

IMAGES = load_images()
CPU_IMAGE = IMAGES["trace-rl-cpu"]
GPU_IMAGE = IMAGES["trace-rl-cuda"]
