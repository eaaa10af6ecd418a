"""chaos: fault injection, one scenario per documented failure (see runbooks/)."""
