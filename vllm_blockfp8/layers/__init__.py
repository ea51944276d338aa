"""vLLM layer methods of the blockfp8 plugin."""
