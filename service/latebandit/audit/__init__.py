"""The audit log: every campaign change, decision and feedback event, durable in SQL."""
