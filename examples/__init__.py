"""Examples of user code a run can name in its config (tasks.rewards = "examples.my_reward:reward")."""
