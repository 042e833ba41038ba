"""cmdare.train."""
