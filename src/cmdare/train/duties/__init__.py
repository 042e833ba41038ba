"""The chief's duties: checkpoints (stored, uploaded), evaluations, export."""
