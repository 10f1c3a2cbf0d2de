"""The Harness: planners, the agent loop and (later) the Scenario Adapter, Skills and Memory."""
