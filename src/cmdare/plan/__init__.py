"""cmdare.plan."""
