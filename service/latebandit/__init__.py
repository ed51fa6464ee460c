"""latebandit: multi-armed bandit decisions whose rewards arrive late."""

__version__ = "0.1.0"
