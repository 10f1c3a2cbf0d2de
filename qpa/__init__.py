"""qpa: the closed AI-for-AI loop for mobile planner agents."""

__version__ = "0.1.0"
