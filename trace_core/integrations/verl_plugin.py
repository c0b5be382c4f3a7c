"""verl's ``verl.plugins`` entry point ``trace``: importing this module (verl does, when it is
imported) registers TRACE's tree-aware advantage as ``algorithm.adv_estimator=trace_tree``
(:mod:`trace_core.integrations.verl`). Where verl is not installed there is no registry to add to,
and importing it does nothing."""

from importlib.util import find_spec

if find_spec("verl") is not None:
    from trace_core.integrations.verl import register

    register()
