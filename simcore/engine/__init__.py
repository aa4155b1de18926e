"""The engine: schedulers and passes over columnar request state."""
