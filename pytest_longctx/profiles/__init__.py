"""What to serve and on what: serving profiles and their shipped TOML files, the hardware this
machine has, and the embedded models' specs. Below every package that starts or measures."""

from __future__ import annotations

from .profile import (
    DEFAULT_PROFILE,
    PROFILE_DIR,
    Profile,
    ProfileError,
    available_profiles,
    load_profile,
)

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILE_DIR",
    "Profile",
    "ProfileError",
    "available_profiles",
    "load_profile",
]
