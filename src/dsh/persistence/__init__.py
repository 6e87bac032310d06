"""dsh.persistence."""
