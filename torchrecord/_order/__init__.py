"""Pure order functions (NumPy only): which reader visits which samples, in which order, for every kind of dataset."""
