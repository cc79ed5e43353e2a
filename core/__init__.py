"""The session core: its logic as a plain state machine, and the effects it asks for."""
