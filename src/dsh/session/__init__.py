"""dsh.session."""
