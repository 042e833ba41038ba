"""A run on Ray: its driver loop, set-up, controller, metrics, control files and end."""
