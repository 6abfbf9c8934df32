"""The HTTP surface of batch-size sweeps and the store of sweeps (never imports torch)."""
