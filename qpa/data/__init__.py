"""AI for Data: task generation, trajectory collection, curation, mixture and review."""
