"""cmdare.ps."""
