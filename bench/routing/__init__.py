"""`tiergate bench routing`: is routing worth it? Quality kept per cost, tiergate's router vs random."""
