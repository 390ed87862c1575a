"""Where compat's knowledge comes from: each module turns published artifacts into the data
builder/data/knowledge holds."""
