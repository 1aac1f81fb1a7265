"""The node side of a run: the ClientApp of every node (app), its warm worker (warm), its learner (policy, private
task stream, learning steps) and its state on local disk (state)."""
