"""REST API infrastructure shared by the broker, consumers and jobs apps (docs/api.md)."""
