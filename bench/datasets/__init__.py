"""Readers of the data sets the benchmarks, the evaluation and the calibration use."""
