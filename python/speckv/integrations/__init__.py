"""Bridges from speckv to other systems (each imports its system only when imported itself)."""
