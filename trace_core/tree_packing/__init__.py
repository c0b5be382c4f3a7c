"""Packed rollout trees: each distinct token once, ancestor-only attention — one path shared by
the policy update, its old-log-prob recomputation and the predictor's scoring.

- :mod:`.layout` — token trees and packs (pure numpy; every array linear in tokens or segments);
- :mod:`.attention` — the sparse tree attention (memory linear in the packed tokens), registered
  with transformers as ``"trace_tree"``, and the dense reference mask;
- :mod:`.logprobs` — token log-probs of a packed forward, the LM head run in vocabulary chunks.

Importing this package imports numpy only; :mod:`.attention` and :mod:`.logprobs` import torch,
and transformers when the attention is registered.
"""
