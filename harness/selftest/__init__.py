"""The mutation self-test: every contract's planted bugs must be caught by the kinds they declare."""
