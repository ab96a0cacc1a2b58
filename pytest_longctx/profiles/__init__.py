"""What to serve and on what: serving profiles and their shipped TOML files, the hardware this
machine has, and the embedded models' specs. Below every package that starts or measures."""

from __future__ import annotations

from .profile import (
    DEFAULT_PROFILE,
    FROM_SERVER,
    NO_PROFILE,
    PROFILE_DIR,
    Profile,
    ProfileError,
    ServerSettings,
    SweepSpec,
    available_profiles,
    from_server,
    load_profile,
)

__all__ = [
    "DEFAULT_PROFILE",
    "FROM_SERVER",
    "NO_PROFILE",
    "PROFILE_DIR",
    "Profile",
    "ProfileError",
    "ServerSettings",
    "SweepSpec",
    "available_profiles",
    "from_server",
    "load_profile",
]
