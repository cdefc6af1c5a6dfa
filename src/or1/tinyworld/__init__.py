"""Models of the tiny world (tokenizer, Qwen2 build, warm start) and loading of any HF causal LM."""
