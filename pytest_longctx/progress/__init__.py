"""Watching a point while it runs, without pytest: the sampler, the ETA model, the progress
state and its file, the per-point sample files and device telemetry.

``samples``, ``eta`` and ``energy`` are pure (files and arithmetic) and the reports may read
them; ``sampler`` talks to the server and ``telemetry`` runs the device tools.
"""
