"""Pull consumers, dead-letter queues and job summaries (SPEC §4)."""
