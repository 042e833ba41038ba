"""cmdare.measure."""
