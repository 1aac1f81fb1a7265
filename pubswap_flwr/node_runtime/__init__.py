"""What a node runs a message with, below the protocols whose handlers use it: its learner (learner.py), its state
on disk (state.py) and the serving of one message to a handler (serving.py)."""
