"""dsh.compaction."""
