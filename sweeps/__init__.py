"""Plans, searches, records and analyses batch-size sweeps."""
