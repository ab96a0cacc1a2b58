"""The campaign without pytest: the run's state, the server's lifecycle, a point's setup,
measurement and judgement, resume, signals. The pytest layer (``session/``) drives it."""
