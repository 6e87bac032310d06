"""dsh.interop."""
