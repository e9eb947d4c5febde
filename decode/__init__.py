"""drafterkit's speculative decoder: proposal, verification, KV-cache bookkeeping, metrics, benchmarks."""
