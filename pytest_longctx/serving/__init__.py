"""The measured server: profiles, vLLM's command line, the process, hardware, models."""
