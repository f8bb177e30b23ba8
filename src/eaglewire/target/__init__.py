"""Target models: loading, locating the decoder stack, and capturing tapped hidden states."""
