"""Environments behind the shared contract: sandbox, llm_sim, device, and remote clients."""
