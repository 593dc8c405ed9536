"""The artifact store under FTX_HOME: keyed stage outputs, use leases and housekeeping."""
