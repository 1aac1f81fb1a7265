"""pubswap-flwr: federated and swarm RL post-training (GRPO over LoRA) of small language models on Flower."""

__version__ = "0.1.0"
