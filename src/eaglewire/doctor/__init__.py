"""eaglewire doctor: find silent wiring failures of a draft before it is deployed."""
