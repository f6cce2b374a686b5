"""mmserver."""
