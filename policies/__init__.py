"""Decisions without I/O (except the budget store): config, classify, route, budgets, breakers."""
