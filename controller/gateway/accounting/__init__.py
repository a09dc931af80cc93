"""Who asks and how much: API keys, per-key quotas, token usage, metrics, requests in flight."""
