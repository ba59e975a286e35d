"""Quality evaluation behind `tiergate eval ...`."""
