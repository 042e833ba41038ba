"""A run on Ray: its driver loop and PS commands, set-up, controller, metrics, session and end."""
