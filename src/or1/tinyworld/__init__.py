"""The tiny world's model: its tokenizer, the Qwen2 build, the warm start, `or1 init-model` and solve rates."""
