"""Replays of event logs: the state a log implies, rebuilds of the state store, backtests."""
