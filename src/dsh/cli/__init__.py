"""dsh.cli."""
