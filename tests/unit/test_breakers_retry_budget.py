"""Retry budget (retries <= ratio x requests over a sliding window) and the request deadline."""

from __future__ import annotations

from policies.limits_config import RetryConfig
from policies.retry_budget import Deadline, RetryBudget


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_retries_stay_within_the_ratio_of_requests():
    clock = Clock()
    budget = RetryBudget(RetryConfig(budget_ratio=0.2, window_s=10), clock)
    for _ in range(50):
        budget.record_request()
    granted = sum(budget.try_retry() for _ in range(100))   # a storm: every request wants retries
    assert granted == 10
    assert budget.snapshot() == (50, 10)
    for _ in range(5):
        budget.record_request()
    assert budget.try_retry() and not budget.try_retry()     # 55 requests -> 11 retries


def test_the_window_slides():
    clock = Clock()
    budget = RetryBudget(RetryConfig(budget_ratio=0.5, window_s=10), clock)
    for _ in range(10):
        budget.record_request()
    assert sum(budget.try_retry() for _ in range(10)) == 5
    clock.t += 10.5                       # everything above left the window
    assert budget.snapshot() == (0, 0) and not budget.try_retry()
    budget.record_request()
    budget.record_request()
    assert budget.try_retry() and not budget.try_retry()


def test_minimum_retries_for_low_traffic():
    budget = RetryBudget(RetryConfig(budget_ratio=0.1, window_s=10, min_retries_per_window=2), Clock())
    budget.record_request()
    assert budget.try_retry() and budget.try_retry() and not budget.try_retry()


def test_deadline_caps_attempt_timeouts():
    clock = Clock()
    deadline = Deadline.after(5.0, clock)
    assert deadline.cap(30.0) == 5.0 and deadline.cap(2.0) == 2.0 and deadline.cap(None) == 5.0
    clock.t += 4.0
    assert deadline.remaining() == 1.0 and not deadline.expired
    clock.t += 1.5
    assert deadline.expired and deadline.cap(10.0) == 0.0
