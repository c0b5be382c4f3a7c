"""verl's ``verl.plugins`` entry point ``trace``: importing this module (verl does, when it is
imported) registers TRACE's tree-aware advantage as ``algorithm.adv_estimator=trace_tree``
(:mod:`trace_core.integrations.verl`)."""

from trace_core.integrations.verl import register

register()
