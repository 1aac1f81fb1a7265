"""The protocols' pure algorithms, free of Flower and torch and testable alone: SAPO's packet relay and I local +
J external selection (sapo_selection.py, used by protocols/sapo.py) and PubSwap's Balanced / Random / None response
sets (pubswap_response_sets.py, used by protocols/pubswap.py); DAPO's dynamic sampling on a node's private steps
(dynamic_sampling.py, used by node_runtime/learner.py)."""
