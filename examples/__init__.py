"""Examples of user code a run can name in its config (tasks.rewards = "examples.my_reward:reward", tasks.trl-rewards
= "examples.trl_reward:reward_len+examples.trl_reward:format_reward")."""
