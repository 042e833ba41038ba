"""cmdare.predict."""
