"""What runs handlers: slot suppliers, pools, cells and the worker daemon."""
