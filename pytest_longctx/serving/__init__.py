"""The measured server: vLLM's command line, the process and its guard, the embedded
models' build, the served model's description."""
