"""One point measured: the measured target, server metrics, first-token budgets, the point."""
