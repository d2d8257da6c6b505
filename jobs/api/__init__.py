"""Pull consumers, dead-letter queues and job summaries (docs/api.md)."""
