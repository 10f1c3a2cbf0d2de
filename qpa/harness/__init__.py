"""The Harness: planners and model backends, the agent loop, the Scenario Adapter with Skills,
Persistent Memory, the provenance guard, and serving as a KServe predictor."""
