"""or1: Skywork-OR1 reasoning RL, end to end."""

__version__ = "0.1.0"
