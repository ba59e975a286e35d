"""The operator console: a page at /console and the JSON it polls (see docs/CONSOLE.md)."""
