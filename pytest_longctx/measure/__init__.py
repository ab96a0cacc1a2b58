"""One point measured: the client, prompts, server metrics, first-token budgets."""
