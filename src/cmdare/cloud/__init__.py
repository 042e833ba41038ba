"""cmdare.cloud."""
