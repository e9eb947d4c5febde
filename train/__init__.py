"""Drafter training: data, target features, losses, the accelerate loop, in-loop evaluation."""
