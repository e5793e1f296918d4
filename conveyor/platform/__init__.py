"""The broker-agnostic runtime core: ids, messages, mapper, adapter port, agents."""
