"""What operators run against a broker: status, dead letters, consumer groups."""
